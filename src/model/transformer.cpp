// The transformer's chunks: forward and backward of the embedding, the
// attention and FFN blocks, and the head with its loss, per micro-batch.
//
// Zero-bubble split (backward with weight_grad = false): the linear layers of
// attention (Q, K, V, O) and the LM head stash (input, output-gradient) and
// compute their weight gradients in backward_weight(). The RMSNorm scales,
// the embedding, the dense SwiGLU FFN and the MoE layer compute their weight
// gradients in B already: the SwiGLU and MoE backward kernels produce input
// and weight gradients in one pass, and splitting them would recompute GEMMs.
#include "trident/model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/model/blocks.hpp"

namespace trident::model {

std::pair<int, int> layer_range(int n_layers, int n_virtual, int vs,
                                const std::vector<int>& layout) {
  if (!layout.empty()) {
    TRIDENT_CHECK(int(layout.size()) == n_virtual && vs >= 0 && vs < n_virtual,
                  "layer_range: a layout of " + std::to_string(layout.size()) +
                      " stages for virtual stage " + std::to_string(vs) + " of " +
                      std::to_string(n_virtual));
    int begin = 0;
    for (int s = 0; s < vs; ++s) begin += layout[size_t(s)];
    return {begin, begin + layout[size_t(vs)]};
  }
  const int base = n_layers / n_virtual, extra = n_layers % n_virtual;
  const int begin = vs * base + std::min(vs, extra);
  return {begin, begin + base + (vs < extra ? 1 : 0)};
}

namespace {

kernels::RopeFreqs rope_freqs(const ModelConfig& m) {
  kernels::RopeFreqs r(m.rope_theta);
  r.kind = m.rope_scaling == RopeScaling::linear   ? kernels::RopeKind::linear
           : m.rope_scaling == RopeScaling::llama3 ? kernels::RopeKind::llama3
                                                   : kernels::RopeKind::none;
  r.factor = m.rope_factor;
  r.low_freq_factor = m.rope_low_freq_factor;
  r.high_freq_factor = m.rope_high_freq_factor;
  r.original_max = double(m.rope_original_max_positions);
  return r;
}

// Rows [s * Ls, (s + 1) * Ls) of t: sequence s of a micro-batch.
Tensor seq(const Tensor& t, int64_t s, int64_t Ls) { return t.rows(s * Ls, (s + 1) * Ls); }

// Sample s's RoPE positions: its own (packed documents) or the global ones.
Tensor rope_positions(const MicroBatch& mb, int64_t s) {
  if (mb.rope_positions.empty()) return mb.on_device.positions;
  return seq(mb.on_device.rope_positions, s, mb.local_seq);
}

// Sample s's documents for the attention core (none: one document).
SeqDocs seq_docs(const MicroBatch& mb, int64_t s) {
  if (mb.doc_ids.empty()) return {};
  const bool own = !mb.layouts.empty() && !mb.layouts[size_t(s)].empty();
  return {seq(mb.on_device.doc_ids, s, mb.local_seq), mb.doc_ids.data() + s * mb.local_seq,
          own ? &mb.layouts[size_t(s)] : nullptr};
}

// Sample s's global positions when it has its own layout (a capture's
// Capture::positions); empty under a fixed layout.
std::vector<int64_t> capture_positions(const MicroBatch& mb, int64_t s) {
  if (mb.seq_positions.empty()) return {};
  const auto first = mb.seq_positions.begin() + s * mb.local_seq;
  return {first, first + mb.local_seq};
}

// dW[out,in] += dyᵀ x, now or later (zero-bubble W).
struct WeightGradTask {
  Param* p;
  Tensor x, dy;
};

void run_task(const kernels::Ctx& ctx_, WeightGradTask& t) {
  kernels::linear_backward_weight(ctx_, t.dy, t.x, t.p->grad);
}

}  // namespace

void GemmPrecision::add(const Param& p) {
  if (!bf16_ || copies_.count(&p) || packed_.count(&p)) return;
  auto packed = std::make_unique<kernels::PackedBf16Weight>(ctx_, p.value);
  if (packed->has_forms())
    packed_.emplace(&p, std::move(packed));
  else
    copies_.emplace(&p, kernels::empty(ctx_, p.value.shape(), DType::bf16));
}

const Tensor& GemmPrecision::weight(const Param& p) const {
  if (!bf16_ || packed_.count(&p)) return p.value;
  const auto it = copies_.find(&p);
  if (it == copies_.end())
    throw Error("GemmPrecision: " + p.name + " was not registered as a GEMM weight");
  return it->second;
}

const kernels::PackedBf16Weight* GemmPrecision::packed(const Param& p) const {
  const auto it = packed_.find(&p);
  return it == packed_.end() ? nullptr : it->second.get();
}

void GemmPrecision::refresh() {
  for (auto& [param, copy] : copies_) kernels::convert(ctx_, param->value, copy);
  for (auto& [param, packed] : packed_) packed->refresh(param->value);
}

Tensor GemmPrecision::activation(std::vector<int64_t> shape) const {
  return kernels::empty(ctx_, std::move(shape), bf16_ ? DType::bf16 : DType::f32);
}

// ---- attention block ----

struct AttentionBlock {
  kernels::Ctx ctx_;
  GemmPrecision& lp;
  int layer;
  int64_t d, H, Hkv, D;
  kernels::RopeFreqs freqs;
  float eps;
  bool qk_norm;
  Param norm, wq, wk, wv, wo;
  Param q_norm, k_norm;  // model.qk_norm: one RMSNorm scale per head dimension
  std::unique_ptr<AttentionCore> core;

  // x is the block's input, shared with whoever produced it (not copied).
  // With qk_norm, q_in/k_in are the projections before the head norms.
  struct Cache {
    Tensor x, h1, q, k, v, o, lse, rstd;
    Tensor q_in, k_in, q_rstd, k_rstd;
  };

  AttentionBlock(const kernels::Ctx& ctx, GemmPrecision& precision, const ModelConfig& m, int l,
                 std::unique_ptr<AttentionCore> c)
      : ctx_(ctx),
        lp(precision),
        layer(l),
        d(m.d_model),
        H(m.n_heads),
        Hkv(m.n_kv_heads),
        D(m.head_dim()),
        freqs(rope_freqs(m)),
        eps(float(m.norm_eps)),
        qk_norm(m.qk_norm),
        core(std::move(c)) {
    const std::string p = "layers." + std::to_string(l) + ".attn.";
    norm = Param(p + "norm", {d});
    norm.init_constant(1.0f);
    norm.decay = false;
    wq = Param(p + "wq", {H * D, d});
    wk = Param(p + "wk", {Hkv * D, d});
    wv = Param(p + "wv", {Hkv * D, d});
    wo = Param(p + "wo", {d, H * D});
    const float s = float(m.init_std);
    wq.init_normal(s);
    wk.init_normal(s);
    wv.init_normal(s);
    // scaled so that the residual stream does not grow with depth
    wo.init_normal(s / std::sqrt(2.0f * float(m.n_layers)));
    for (Param* w : {&wq, &wk, &wv, &wo}) lp.add(*w);
    if (qk_norm) {
      q_norm = Param(p + "q_norm", {D});
      k_norm = Param(p + "k_norm", {D});
      for (Param* n : {&q_norm, &k_norm}) {
        n->init_constant(1.0f);
        n->decay = false;
      }
    }
  }

  std::vector<Param*> params() {
    if (qk_norm) return {&norm, &wq, &wk, &wv, &wo, &q_norm, &k_norm};
    return {&norm, &wq, &wk, &wv, &wo};
  }

  // q or k = RMSNorm over each head of the projection `in` (rows [T * heads, D]).
  void head_norm_forward(const Param& w, const Tensor& in, const Tensor& out, Tensor& rstd) {
    const int64_t rows = in.numel() / D;
    rstd = kernels::empty(ctx_, {rows});
    kernels::rmsnorm_forward(ctx_, in.reshape({rows, D}), w.value, eps, out.reshape({rows, D}),
                             rstd);
  }

  // x [T, d] -> y = x + attn(norm(x)) (y may not alias x).
  void forward(const MicroBatch& mb, const Tensor& x, Tensor& y, Cache& c,
               std::vector<Capture>* cap, const CaptureRequest* req) {
    const int64_t T = mb.tokens_total(), Ls = mb.local_seq;
    c.x = x;
    c.h1 = lp.activation({T, d});
    c.rstd = kernels::empty(ctx_, {T});
    kernels::rmsnorm_forward(ctx_, x, norm.value, eps, c.h1, c.rstd);
    c.q = lp.activation({T, H * D});
    c.k = lp.activation({T, Hkv * D});
    c.v = lp.activation({T, Hkv * D});
    if (qk_norm) {
      c.q_in = kernels::empty(ctx_, {T, H * D});
      c.k_in = kernels::empty(ctx_, {T, Hkv * D});
      kernels::linear_forward(ctx_, c.h1, lp.weight(wq), c.q_in, lp.packed(wq));
      kernels::linear_forward(ctx_, c.h1, lp.weight(wk), c.k_in, lp.packed(wk));
      head_norm_forward(q_norm, c.q_in, c.q, c.q_rstd);
      head_norm_forward(k_norm, c.k_in, c.k, c.k_rstd);
    } else {
      kernels::linear_forward(ctx_, c.h1, lp.weight(wq), c.q, lp.packed(wq));
      kernels::linear_forward(ctx_, c.h1, lp.weight(wk), c.k, lp.packed(wk));
    }
    kernels::linear_forward(ctx_, c.h1, lp.weight(wv), c.v, lp.packed(wv));
    for (int64_t s = 0; s < mb.n_samples; ++s) {
      const Tensor pos = rope_positions(mb, s);
      kernels::rope_forward(ctx_, seq(c.q, s, Ls), pos, D, freqs);
      kernels::rope_forward(ctx_, seq(c.k, s, Ls), pos, D, freqs);
    }
    c.o = lp.activation({T, H * D});
    c.lse = kernels::empty(ctx_, {T, H});
    for (int64_t s = 0; s < mb.n_samples; ++s)
      core->forward(seq(c.q, s, Ls), seq(c.k, s, Ls), seq(c.v, s, Ls), Ls, seq(c.o, s, Ls),
                    seq(c.lse, s, Ls), seq_docs(mb, s));
    if (cap && req && req->layers.count(layer)) {
      for (int64_t s = 0; s < mb.n_samples; ++s) {
        if (!req->samples.count(mb.sample_ids[size_t(s)])) continue;
        auto keep = [&](const char* name, const Tensor& t, int64_t width) {
          if (!req->names.count(name)) return;
          Capture k{layer, name, mb.sample_ids[size_t(s)], width, {}, {}};
          Tensor rows = seq(t, s, Ls);
          if (rows.dtype() != DType::f32) {  // captures are f32 (the run file's contract)
            Tensor wide = kernels::empty(ctx_, rows.shape());
            kernels::convert(ctx_, rows, wide);
            rows = wide;
          }
          const Tensor host = kernels::to_host(ctx_, rows);  // the capture's one copy
          k.rows.assign(host.ptr(), host.ptr() + Ls * width);
          k.positions = capture_positions(mb, s);
          cap->push_back(std::move(k));
        };
        keep("q", c.q, H * D);
        keep("k", c.k, Hkv * D);
        keep("v", c.v, Hkv * D);
        keep("attn_out", c.o, H * D);
      }
    }
    kernels::linear_forward(ctx_, c.o, lp.weight(wo), y, lp.packed(wo));
    kernels::add_inplace(ctx_, y, x);
  }

  // Selective recompute: the normed input h1 is dropped after the forward
  // (drop_norm) and computed again from x before the backward (renorm), bit
  // for bit what the forward had.
  void drop_norm(Cache& c) const { c.h1 = Tensor(); }
  void renorm(Cache& c) {
    c.h1 = lp.activation({c.x.dim(0), d});
    kernels::rmsnorm_forward(ctx_, c.x, norm.value, eps, c.h1, c.rstd);
  }

  // dy [T, d] -> dx [T, d] (overwritten). Linear weight gradients go to
  // `deferred` when it is given, else are computed now; a deferred task
  // shares dy, so the caller must not write to dy afterwards.
  void backward(const MicroBatch& mb, const Tensor& dy, Tensor& dx, Cache& c,
                std::vector<WeightGradTask>* deferred) {
    const int64_t T = mb.tokens_total(), Ls = mb.local_seq;
    Tensor dout = lp.activation({T, H * D});
    kernels::linear_backward_input(ctx_, dy, lp.weight(wo), dout, 0.0f, lp.packed(wo));
    Tensor dq = kernels::empty(ctx_, {T, H * D}), dk = kernels::empty(ctx_, {T, Hkv * D}),
           dv = kernels::empty(ctx_, {T, Hkv * D});
    for (int64_t s = 0; s < mb.n_samples; ++s)
      core->backward(seq(c.q, s, Ls), seq(c.k, s, Ls), seq(c.v, s, Ls), Ls, seq(c.o, s, Ls),
                     seq(c.lse, s, Ls), seq(dout, s, Ls), seq(dq, s, Ls), seq(dk, s, Ls),
                     seq(dv, s, Ls), seq_docs(mb, s));
    for (int64_t s = 0; s < mb.n_samples; ++s) {
      const Tensor pos = rope_positions(mb, s);
      kernels::rope_backward(ctx_, seq(dq, s, Ls), pos, D, freqs);
      kernels::rope_backward(ctx_, seq(dk, s, Ls), pos, D, freqs);
    }
    if (qk_norm) {  // through the head norms: dq, dk become the projections' gradients
      Tensor dq_in = kernels::empty(ctx_, {T, H * D}), dk_in = kernels::empty(ctx_, {T, Hkv * D});
      kernels::rmsnorm_backward(ctx_, dq.reshape({T * H, D}), c.q_in.reshape({T * H, D}),
                                q_norm.value, c.q_rstd, dq_in.reshape({T * H, D}), q_norm.grad);
      kernels::rmsnorm_backward(ctx_, dk.reshape({T * Hkv, D}), c.k_in.reshape({T * Hkv, D}),
                                k_norm.value, c.k_rstd, dk_in.reshape({T * Hkv, D}), k_norm.grad);
      dq = std::move(dq_in);
      dk = std::move(dk_in);
    }
    Tensor dh1 = kernels::empty(ctx_, {T, d});
    kernels::linear_backward_input(ctx_, dq, lp.weight(wq), dh1, 0.0f, lp.packed(wq));
    kernels::linear_backward_input(ctx_, dk, lp.weight(wk), dh1, 1.0f, lp.packed(wk));
    kernels::linear_backward_input(ctx_, dv, lp.weight(wv), dh1, 1.0f, lp.packed(wv));
    kernels::rmsnorm_backward(ctx_, dh1, c.x, norm.value, c.rstd, dx, norm.grad);
    kernels::add_inplace(ctx_, dx, dy);
    std::vector<WeightGradTask> tasks;
    tasks.push_back({&wo, std::move(c.o), dy});
    tasks.push_back({&wq, c.h1, std::move(dq)});
    tasks.push_back({&wk, c.h1, std::move(dk)});
    tasks.push_back({&wv, std::move(c.h1), std::move(dv)});
    for (auto& t : tasks) {
      if (deferred)
        deferred->push_back(std::move(t));
      else
        run_task(ctx_, t);
    }
    c = Cache{};
  }
};

// ---- FFN block: x -> x + ffn(norm(x)) ----

struct FfnBlock {
  kernels::Ctx ctx_;
  GemmPrecision& lp;
  int layer;
  int64_t d;
  float eps;
  Param norm;
  std::unique_ptr<FeedForward> ffn;

  struct Cache {
    Tensor x, h, rstd;  // x shared with the block's producer
    FfnCache inner;
  };

  FfnBlock(const kernels::Ctx& ctx, GemmPrecision& precision, const ModelConfig& m, int l,
           std::unique_ptr<FeedForward> f)
      : ctx_(ctx),
        lp(precision),
        layer(l),
        d(m.d_model),
        eps(float(m.norm_eps)),
        ffn(std::move(f)) {
    norm = Param("layers." + std::to_string(l) + ".ffn_norm", {d});
    norm.init_constant(1.0f);
    norm.decay = false;
  }

  std::vector<Param*> params() {
    std::vector<Param*> ps{&norm};
    for (Param* p : ffn->params()) ps.push_back(p);
    return ps;
  }

  void forward(const MicroBatch& mb, const Tensor& x, Tensor& y, Cache& c, FfnStats& stats) {
    const int64_t T = mb.tokens_total();
    c.x = x;
    c.h = ffn->reads_bf16() ? lp.activation({T, d}) : kernels::empty(ctx_, {T, d});
    c.rstd = kernels::empty(ctx_, {T});
    kernels::rmsnorm_forward(ctx_, x, norm.value, eps, c.h, c.rstd);
    ffn->forward(mb, c.h, y, c.inner, stats);
    kernels::add_inplace(ctx_, y, x);
  }

  // Selective recompute drops the normed input h and what the FFN can make
  // again from it (drop), and computes both again before the backward.
  void drop_recomputable(Cache& c) const {
    c.h = Tensor();
    c.inner.x = Tensor();
    ffn->drop(c.inner);
  }
  void recompute(Cache& c) {
    c.h =
        ffn->reads_bf16() ? lp.activation({c.x.dim(0), d}) : kernels::empty(ctx_, {c.x.dim(0), d});
    kernels::rmsnorm_forward(ctx_, c.x, norm.value, eps, c.h, c.rstd);
    c.inner.x = c.h;
    ffn->recompute(c.inner);
  }

  void backward(const MicroBatch& mb, const Tensor& dy, Tensor& dx, Cache& c, float aux_scale) {
    const int64_t T = mb.tokens_total();
    Tensor dh = kernels::empty(ctx_, {T, d});
    ffn->backward(dy, dh, c.inner, aux_scale);
    kernels::rmsnorm_backward(ctx_, dh, c.x, norm.value, c.rstd, dx, norm.grad);
    kernels::add_inplace(ctx_, dx, dy);
    c = Cache{};
  }
};

// Dense SwiGLU FFN (the shared kernel; weights [f, d], [f, d], [d, f], keyed
// in [in, out] order: core/param.hpp).
class DenseSwiGLU : public FeedForward {
 public:
  DenseSwiGLU(const kernels::Ctx& ctx, const ModelConfig& m, int l, GemmPrecision& precision)
      : ctx_(ctx), lp_(precision), d_(m.d_model), f_(m.ffn_hidden) {
    const std::string p = "layers." + std::to_string(l) + ".ffn.";
    w_gate_ = Param(p + "w_gate", {f_, d_});
    w_up_ = Param(p + "w_up", {f_, d_});
    w_down_ = Param(p + "w_down", {d_, f_});
    w_gate_.init_normal_in_out_keyed(float(m.init_std));
    w_up_.init_normal_in_out_keyed(float(m.init_std));
    w_down_.init_normal_in_out_keyed(float(m.init_std) / std::sqrt(2.0f * float(m.n_layers)));
    for (Param* w : {&w_gate_, &w_up_, &w_down_}) lp_.add(*w);
  }
  std::vector<Param*> params() override { return {&w_gate_, &w_up_, &w_down_}; }
  bool reads_bf16() const override { return lp_.bf16(); }
  void forward(const MicroBatch& mb, const Tensor& x, const Tensor& y, FfnCache& c,
               FfnStats&) override {
    const int64_t T = mb.tokens_total();
    c.x = x;
    c.gate = lp_.activation({T, f_});
    c.up = lp_.activation({T, f_});
    kernels::swiglu_forward(ctx_, x, lp_.weight(w_gate_), lp_.weight(w_up_), lp_.weight(w_down_), y,
                            c.gate, c.up, packed());
  }
  void backward(const Tensor& dy, const Tensor& dx, FfnCache& c, float) override {
    kernels::swiglu_backward(ctx_, c.x, c.gate, c.up, dy, lp_.weight(w_gate_), lp_.weight(w_up_),
                             lp_.weight(w_down_), dx, w_gate_.grad, w_up_.grad, w_down_.grad,
                             packed());
  }
  void drop(FfnCache& c) override {
    c.gate = Tensor();
    c.up = Tensor();
  }
  // The fused kernel computes gate and up with the output: its output goes
  // to a scratch tensor (the same f32 [T, d] as the forward's).
  void recompute(FfnCache& c) override {
    const int64_t T = c.x.dim(0);
    c.gate = lp_.activation({T, f_});
    c.up = lp_.activation({T, f_});
    const Tensor discarded = kernels::empty(ctx_, {T, d_});
    kernels::swiglu_forward(ctx_, c.x, lp_.weight(w_gate_), lp_.weight(w_up_), lp_.weight(w_down_),
                            discarded, c.gate, c.up, packed());
  }

 private:
  kernels::SwigluPacked packed() const { return lp_.packed(w_gate_, w_up_, w_down_); }

  kernels::Ctx ctx_;
  GemmPrecision& lp_;
  int64_t d_, f_;
  Param w_gate_, w_up_, w_down_;
};

std::unique_ptr<FeedForward> make_dense_ffn(const kernels::Ctx& ctx, const ModelConfig& m,
                                            int layer, GemmPrecision& precision) {
  return std::make_unique<DenseSwiGLU>(ctx, m, layer, precision);
}

// ---- one virtual stage ----

class Chunk {
 public:
  Chunk(ModelStage& st, int vs, int n_virtual) : st_(st), ctx_(st.ctx_) {
    const ModelConfig& m = st.cfg_.model;
    d_ = m.d_model;
    V_ = m.vocab_size;
    first_ = vs == 0;
    last_ = vs == n_virtual - 1;
    auto [b, e] = layer_range(m.n_layers, n_virtual, vs, st.cfg_.parallel.pp_layout);
    for (int l = b; l < e; ++l) {
      auto core = make_attention_core(ctx_, st.cfg_, st.comms_);
      core->spans = &st.attn_spans_;
      core->layer = l;
      attn_.push_back(std::make_unique<AttentionBlock>(ctx_, st.precision_, m, l, std::move(core)));
      ffn_.push_back(std::make_unique<FfnBlock>(
          ctx_, st.precision_, m, l,
          m.is_moe_layer(l) ? make_moe_ffn(ctx_, st.cfg_, l, st.comms_, st.precision_)
                            : make_dense_ffn(ctx_, m, l, st.precision_)));
    }
    // Tied: the stage's one table serves as both (model.tie_embeddings).
    const bool tied = m.tie_embeddings;
    if (first_) {
      if (tied) {
        embed_ = st.tied_embedding_.get();
      } else {
        own_embed_ = Param("embedding", {V_, d_});
        own_embed_.init_normal(float(m.init_std));
        own_embed_.decay = false;
        embed_ = &own_embed_;
      }
    }
    if (last_) {
      final_norm_ = Param("final_norm", {d_});
      final_norm_.init_constant(1.0f);
      final_norm_.decay = false;
      if (tied) {
        head_ = st.tied_embedding_.get();
      } else {
        own_head_ = Param("lm_head", {V_, d_});
        own_head_.init_normal(float(m.init_std));
        st.precision_.add(own_head_);
        head_ = &own_head_;
      }
    }
  }

  bool first() const { return first_; }
  bool last() const { return last_; }

  std::vector<Param*> params() {
    std::vector<Param*> ps;
    if (first_) ps.push_back(embed_);
    for (size_t i = 0; i < attn_.size(); ++i) {
      for (Param* p : attn_[i]->params()) ps.push_back(p);
      for (Param* p : ffn_[i]->params()) ps.push_back(p);
    }
    if (last_) {
      ps.push_back(&final_norm_);
      if (head_ != st_.tied_embedding_.get()) ps.push_back(head_);
    }
    return ps;
  }
  std::vector<FeedForward*> ffns() {
    std::vector<FeedForward*> fs;
    for (auto& f : ffn_) fs.push_back(f->ffn.get());
    return fs;
  }

  // Every block writes a new tensor (the next block's caches share it); the
  // last block of a non-last chunk writes straight into `output`.
  void forward(int mbi, const Tensor& input, Tensor& output) {
    const MicroBatch& mb = st_.mbs_.at(size_t(mbi));
    const int64_t T = mb.tokens_total();
    Cache& c = cache_[mbi];
    c = Cache{};
    c.attn.resize(attn_.size());
    c.ffn.resize(ffn_.size());
    Tensor x;
    if (first_) {
      x = kernels::empty(ctx_, {T, d_});
      kernels::embedding_forward(ctx_, embed_->value, mb.on_device.tokens, x);
    } else {
      x = input.reshape({T, d_});
    }
    const bool capturing = st_.capture_ && st_.capture_->active();
    for (size_t i = 0; i < attn_.size(); ++i) {
      Tensor y = kernels::empty(ctx_, {T, d_});
      attn_[i]->forward(mb, x, y, c.attn[i], capturing ? &st_.captures_ : nullptr, st_.capture_);
      FfnStats stats;
      if (capturing && st_.capture_->layers.count(ffn_[i]->layer) &&
          st_.capture_->names.count("router_logits"))
        stats.capture_router_logits = true;
      x = !last_ && i + 1 == attn_.size() ? output.reshape({T, d_}) : kernels::empty(ctx_, {T, d_});
      ffn_[i]->forward(mb, y, x, c.ffn[i], stats);
      record_ffn_stats(mb, i, stats);
      if (recomputes(i)) drop(c, i);
    }
    if (last_) {
      head_forward(mb, c, std::move(x));
    } else if (!x.shares_storage_with(output)) {
      kernels::copy(ctx_, output, x);  // a chunk without blocks
    }
  }

  // Like forward, every block writes a new tensor: a deferred weight-gradient
  // task shares its dy, which must not be overwritten before W.
  void backward(int mbi, const Tensor& grad_output, Tensor& grad_input, bool weight_grad) {
    const MicroBatch& mb = st_.mbs_.at(size_t(mbi));
    const int64_t T = mb.tokens_total();
    auto it = cache_.find(mbi);
    TRIDENT_CHECK(it != cache_.end(), "backward of a micro-batch that has no forward cache");
    Cache& c = it->second;
    std::vector<WeightGradTask>* deferred = weight_grad ? nullptr : &stash_[mbi];
    Tensor dy;
    if (last_) {
      Tensor dh = kernels::empty(ctx_, {T, d_});
      kernels::linear_backward_input(ctx_, c.dlogits, st_.precision_.weight(*head_), dh, 0.0f,
                                     st_.precision_.packed(*head_));
      dy = kernels::empty(ctx_, {T, d_});
      kernels::rmsnorm_backward(ctx_, dh, c.x_final, final_norm_.value, c.rstd_final, dy,
                                final_norm_.grad);
      WeightGradTask t{head_, std::move(c.h_final), std::move(c.dlogits)};
      if (deferred) {
        deferred->push_back(std::move(t));
      } else {
        run_task(ctx_, t);
        report({&final_norm_, head_}, mbi);
      }
    } else {
      dy = grad_output.reshape({T, d_});
    }
    for (size_t i = attn_.size(); i-- > 0;) {
      if (recomputes(i)) refill(mb, c, i);
      Tensor dx = kernels::empty(ctx_, {T, d_});
      ffn_[i]->backward(mb, dy, dx, c.ffn[i], st_.aux_scale_);
      dy = !first_ && i == 0 ? grad_input.reshape({T, d_}) : kernels::empty(ctx_, {T, d_});
      attn_[i]->backward(mb, dx, dy, c.attn[i], deferred);
      if (!deferred) {
        std::vector<Param*> done = attn_[i]->params();
        for (Param* p : ffn_[i]->params()) done.push_back(p);
        report(done, mbi);
      }
    }
    if (first_) {
      kernels::embedding_backward(ctx_, dy, mb.on_device.tokens, embed_->grad);
      if (!deferred) report({embed_}, mbi);
    } else if (!dy.shares_storage_with(grad_input))
      kernels::copy(ctx_, grad_input, dy);  // a chunk without blocks
    cache_.erase(it);
  }

  void discard(int mbi) { cache_.erase(mbi); }

  // B deferred this micro-batch's weight gradients: after W every gradient
  // of the chunk is complete for it.
  void backward_weight(int mbi) {
    auto it = stash_.find(mbi);
    if (it != stash_.end()) {
      for (auto& t : it->second) run_task(ctx_, t);
      stash_.erase(it);
    }
    std::vector<Param*> done = params();
    if (last_ && head_ == st_.tied_embedding_.get()) done.push_back(head_);  // its head part
    report(done, mbi);
  }

 private:
  struct Cache {
    std::vector<AttentionBlock::Cache> attn;
    std::vector<FfnBlock::Cache> ffn;
    Tensor x_final, h_final, dlogits, rstd_final;
  };

  // One block's FFN statistics: the losses' sums, the per-expert token
  // counts and, when captured, the router logits of the captured samples.
  void record_ffn_stats(const MicroBatch& mb, size_t i, const FfnStats& stats) {
    const int64_t T = mb.tokens_total();
    st_.aux_sum_ += stats.aux_loss_sum;
    st_.z_sum_ += stats.z_loss_sum;
    if (stats.moe_index >= 0) {
      auto& row = st_.expert_tokens_.at(size_t(stats.moe_index));
      for (size_t e = 0; e < stats.tokens_per_expert.size(); ++e)
        row[e] += stats.tokens_per_expert[e];
    }
    if (stats.capture_router_logits && !stats.router_logits.empty()) {
      const int64_t E = int64_t(stats.router_logits.size()) / T;
      for (int64_t s = 0; s < mb.n_samples; ++s) {
        if (!st_.capture_->samples.count(mb.sample_ids[size_t(s)])) continue;
        Capture k{ffn_[i]->layer, "router_logits", mb.sample_ids[size_t(s)], E, {}, {}};
        k.rows.assign(stats.router_logits.begin() + s * mb.local_seq * E,
                      stats.router_logits.begin() + (s + 1) * mb.local_seq * E);
        k.positions = capture_positions(mb, s);
        st_.captures_.push_back(std::move(k));
      }
    }
  }

  // The last chunk's tail: final norm, head, loss (and its gradient) of x.
  void head_forward(const MicroBatch& mb, Cache& c, Tensor x) {
    const int64_t T = mb.tokens_total();
    c.x_final = std::move(x);
    c.h_final = st_.precision_.activation({T, d_});
    c.rstd_final = kernels::empty(ctx_, {T});
    kernels::rmsnorm_forward(ctx_, c.x_final, final_norm_.value, float(st_.cfg_.model.norm_eps),
                             c.h_final, c.rstd_final);
    Tensor logits = kernels::empty(ctx_, {T, V_});
    kernels::linear_forward(ctx_, c.h_final, st_.precision_.weight(*head_), logits,
                            st_.precision_.packed(*head_));
    if (st_.capture_ && st_.capture_->logits) capture_logits(mb, logits);
    c.dlogits = kernels::empty(ctx_, {T, V_});
    st_.loss_sum_ +=
        kernels::cross_entropy(ctx_, logits, mb.on_device.targets, st_.loss_scale_, c.dlogits);
  }

  // Parameters whose gradient of micro-batch mbi is final on this rank. The
  // tied table has two parts, the head's and the embedding's (another
  // chunk's in a V schedule): it is final once both are in.
  void report(const std::vector<Param*>& ps, int mbi) const {
    if (!st_.grads_ready_) return;
    Param* tied = st_.tied_embedding_.get();
    std::vector<Param*> done;
    for (Param* p : ps) {
      if (p == tied && ++st_.tied_parts_[mbi] < 2) continue;
      if (p == tied) st_.tied_parts_.erase(mbi);
      done.push_back(p);
    }
    st_.grads_ready_(done);
  }

  // The rows of the requested samples of logits [T, V] (one host copy each).
  void capture_logits(const MicroBatch& mb, const Tensor& logits) {
    const int64_t Ls = mb.local_seq;
    for (int64_t s = 0; s < mb.n_samples; ++s) {
      if (!st_.capture_->samples.count(mb.sample_ids[size_t(s)])) continue;
      const Tensor host = kernels::to_host(ctx_, seq(logits, s, Ls));
      Capture k{-1, "logits", mb.sample_ids[size_t(s)], V_, {}, {}};
      k.rows.assign(host.ptr(), host.ptr() + Ls * V_);
      k.positions = capture_positions(mb, s);
      st_.captures_.push_back(std::move(k));
    }
  }

  // train.recompute on layer i of this chunk (the first recompute_layers).
  bool recomputes(size_t i) const {
    const TrainConfig& t = st_.cfg_.train;
    return t.recompute != Recompute::none &&
           (t.recompute_layers == 0 || int(i) < t.recompute_layers);
  }
  // After layer i's forward: full keeps only the layer's input (the
  // attention block's x); selective drops the normed inputs and the FFN's
  // activations that its GEMMs make from them (SwiGLU gate and up, dense or
  // the experts'), and keeps the attention's (q, k, v, o, lse: recomputing
  // them costs the attention core) and the MoE layer's routing and rows.
  void drop(Cache& c, size_t i) const {
    if (st_.cfg_.train.recompute == Recompute::full) {
      Tensor x = c.attn[i].x;
      c.attn[i] = AttentionBlock::Cache{};
      c.attn[i].x = std::move(x);
      c.ffn[i] = FfnBlock::Cache{};
      return;
    }
    attn_[i]->drop_norm(c.attn[i]);
    ffn_[i]->drop_recomputable(c.ffn[i]);
  }
  // Before layer i's backward: what drop() removed, computed again. Full
  // recompute runs the layer's forward once more, ring exchange and MoE
  // dispatch included (collective like the first time: every rank of the
  // group recomputes the same layer of the same micro-batch in its B), and
  // discards its statistics, captures and output: the kernels are
  // deterministic, so the caches equal the first forward's bit for bit.
  void refill(const MicroBatch& mb, Cache& c, size_t i) {
    if (st_.cfg_.train.recompute == Recompute::full) {
      const int64_t T = mb.tokens_total();
      Tensor y = kernels::empty(ctx_, {T, d_}), z = kernels::empty(ctx_, {T, d_});
      const Tensor x = c.attn[i].x;
      attn_[i]->forward(mb, x, y, c.attn[i], nullptr, nullptr);
      FfnStats discarded;
      ffn_[i]->forward(mb, y, z, c.ffn[i], discarded);
      return;
    }
    attn_[i]->renorm(c.attn[i]);
    ffn_[i]->recompute(c.ffn[i]);
  }
  ModelStage& st_;
  kernels::Ctx ctx_;
  int64_t d_ = 0, V_ = 0;
  bool first_ = false, last_ = false;
  std::vector<std::unique_ptr<AttentionBlock>> attn_;
  std::vector<std::unique_ptr<FfnBlock>> ffn_;
  Param own_embed_, final_norm_, own_head_;
  Param* embed_ = nullptr;  // own_embed_, or the stage's tied table
  Param* head_ = nullptr;   // own_head_, or the stage's tied table
  std::map<int, Cache> cache_;
  std::map<int, std::vector<WeightGradTask>> stash_;
};

// ---- ModelStage ----

ModelStage::ModelStage(const Config& cfg, int pp_rank, int pp, StageComms comms,
                       const std::vector<int>& stages, const kernels::Ctx& ctx)
    : cfg_(cfg),
      pp_rank_(pp_rank),
      pp_(pp),
      comms_(comms),
      ctx_(ctx),
      precision_holder_(std::make_unique<GemmPrecision>(ctx, cfg.train.precision)),
      precision_(*precision_holder_) {
  const int vpp = cfg.parallel.vpp;
  const int n_virtual = pp * vpp;
  if (cfg.model.n_layers < n_virtual)
    throw InputError("model.n_layers: " + std::to_string(cfg.model.n_layers) +
                     " layers cannot fill pp * vpp = " + std::to_string(n_virtual) +
                     " pipeline stages (need at least one layer each)");
  int moe_layers = 0;
  for (int l = 0; l < cfg.model.n_layers; ++l) moe_layers += cfg.model.is_moe_layer(l) ? 1 : 0;
  expert_tokens_.assign(size_t(moe_layers), std::vector<int64_t>(size_t(cfg.model.n_experts), 0));
  TRIDENT_CHECK(
      stages.empty() || static_cast<int>(stages.size()) == vpp,
      "ModelStage: " + std::to_string(stages.size()) + " stages for vpp = " + std::to_string(vpp));
  std::vector<int> held;
  for (int c = 0; c < vpp; ++c)
    held.push_back(stages.empty() ? c * pp + pp_rank : stages[size_t(c)]);
  const bool has_first = std::count(held.begin(), held.end(), 0) > 0;
  const bool has_last = std::count(held.begin(), held.end(), n_virtual - 1) > 0;
  if (cfg.model.tie_embeddings && has_first != has_last)
    throw InputError("model.tie_embeddings: this rank holds the " +
                     std::string(has_first ? "first" : "last") + " pipeline stage but not the " +
                     (has_first ? "last" : "first") +
                     "; tied embeddings need both on one rank (parallel.pp = 1 or a V schedule)");
  if (cfg.model.tie_embeddings && has_first) {
    tied_embedding_ = std::make_unique<Param>(
        "embedding", std::vector<int64_t>{cfg.model.vocab_size, cfg.model.d_model});
    tied_embedding_->init_normal(float(cfg.model.init_std));
    tied_embedding_->decay = false;
    precision_.add(*tied_embedding_);
  }
  for (int c = 0; c < vpp; ++c)
    chunks_.push_back(std::make_unique<Chunk>(*this, held[size_t(c)], n_virtual));
}

ModelStage::~ModelStage() = default;

int ModelStage::n_chunks() const { return static_cast<int>(chunks_.size()); }
bool ModelStage::is_first(int c) const { return chunks_.at(size_t(c))->first(); }
bool ModelStage::is_last(int c) const { return chunks_.at(size_t(c))->last(); }

std::vector<Param*> ModelStage::params() {
  std::vector<Param*> ps;
  for (auto& c : chunks_)
    for (Param* p : c->params()) ps.push_back(p);
  return ps;
}

void ModelStage::begin_step(std::vector<MicroBatch> mbs, float loss_scale, float aux_scale,
                            const CaptureRequest* capture) {
  mbs_ = std::move(mbs);
  loss_scale_ = loss_scale;
  aux_scale_ = aux_scale;
  capture_ = capture;
  loss_sum_ = 0;
  aux_sum_ = 0;
  z_sum_ = 0;
  for (auto& row : expert_tokens_) std::fill(row.begin(), row.end(), 0);
  captures_.clear();
  precision_.refresh();
  for (MicroBatch& mb : mbs_) {
    const int64_t T = mb.tokens_total(), Ls = mb.local_seq;
    TRIDENT_CHECK(int64_t(mb.tokens.size()) == T && int64_t(mb.targets.size()) == T &&
                      int64_t(mb.positions.size()) == Ls,
                  "ModelStage::begin_step: a micro-batch's tokens, targets and positions do not "
                  "match its shape");
    mb.on_device.tokens = kernels::from_host(ctx_, mb.tokens.data(), {T}, DType::i32);
    mb.on_device.targets = kernels::from_host(ctx_, mb.targets.data(), {T}, DType::i32);
    mb.on_device.positions = kernels::from_host(ctx_, mb.positions.data(), {Ls}, DType::i64);
    // Each token's sample, and its index in the micro-batch as one rank
    // holds it (the MoE capacity is decided over whole sequences, whatever
    // the cp split); only the MoE layers read them.
    if (cfg_.model.n_experts > 0) {
      std::vector<int32_t> sample(static_cast<size_t>(T));
      std::vector<int64_t> index(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) {
        const int64_t s = t / Ls;
        sample[size_t(t)] = int32_t(s);
        index[size_t(t)] =
            s * cfg_.data.seq_len +
            (mb.seq_positions.empty() ? mb.positions[size_t(t % Ls)] : mb.seq_positions[size_t(t)]);
      }
      mb.on_device.sample_of_token = kernels::from_host(ctx_, sample.data(), {T}, DType::i32);
      mb.on_device.token_index = kernels::from_host(ctx_, index.data(), {T}, DType::i64);
    }
    TRIDENT_CHECK((mb.doc_ids.empty() || int64_t(mb.doc_ids.size()) == T) &&
                      (mb.rope_positions.empty() || int64_t(mb.rope_positions.size()) == T),
                  "ModelStage::begin_step: a micro-batch's doc_ids or rope_positions do not "
                  "match its shape");
    if (!mb.doc_ids.empty())
      mb.on_device.doc_ids = kernels::from_host(ctx_, mb.doc_ids.data(), {T}, DType::i32);
    if (!mb.rope_positions.empty())
      mb.on_device.rope_positions =
          kernels::from_host(ctx_, mb.rope_positions.data(), {T}, DType::i64);
  }
}

int64_t ModelStage::boundary_numel(int, int mb) const {
  return mbs_.at(size_t(mb)).tokens_total() * cfg_.model.d_model;
}

Allocator& ModelStage::allocator() const { return kernels::allocator_of(ctx_); }

void ModelStage::forward(int chunk, int mb, const Tensor& input, Tensor& output) {
  chunks_.at(size_t(chunk))->forward(mb, input, output);
}

void ModelStage::backward(int chunk, int mb, const Tensor& grad_output, Tensor& grad_input,
                          bool weight_grad) {
  chunks_.at(size_t(chunk))->backward(mb, grad_output, grad_input, weight_grad);
}

void ModelStage::backward_weight(int chunk, int mb) {
  chunks_.at(size_t(chunk))->backward_weight(mb);
}

void ModelStage::discard_forward(int chunk, int mb) { chunks_.at(size_t(chunk))->discard(mb); }

std::vector<Capture> ModelStage::take_captures() { return std::move(captures_); }

void ModelStage::update_router_bias(const std::vector<std::vector<int64_t>>& global_load) {
  for (auto& c : chunks_)
    for (FeedForward* f : c->ffns()) f->update_bias(global_load);
}

std::vector<std::pair<std::string, Tensor*>> ModelStage::buffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto& c : chunks_)
    for (FeedForward* f : c->ffns())
      for (auto& b : f->buffers()) out.push_back(b);
  return out;
}

void ModelStage::buffers_loaded() {
  for (auto& c : chunks_)
    for (FeedForward* f : c->ffns()) f->buffers_loaded();
}

}  // namespace trident::model
