// Attention of one sequence on this rank: the local flash-style kernel when
// the sequence is whole here, ring attention over the cp group otherwise.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "trident/comm/comm.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/model/blocks.hpp"
#include "trident/parallel/cp/config_rules.hpp"
#include "trident/parallel/cp/ring_attention.hpp"
#include "trident/parallel/cp/ulysses_attention.hpp"

namespace trident::model {
namespace {

// The ring works on f32 buffers: a bf16 input is widened into one, and an
// output of another dtype is computed in one and converted after.
Tensor as_f32(const kernels::Ctx& ctx, const Tensor& t) {
  if (t.dtype() == DType::f32) return t;
  Tensor wide = kernels::empty(ctx, t.shape());
  kernels::convert(ctx, t, wide);
  return wide;
}
Tensor f32_out(const kernels::Ctx& ctx, const Tensor& t) {
  return t.dtype() == DType::f32 ? t : kernels::empty(ctx, t.shape());
}
void write_back(const kernels::Ctx& ctx, const Tensor& wide, const Tensor& t) {
  if (!wide.shares_storage_with(t)) kernels::convert(ctx, wide, t);
}

void record(AttentionCore& core, double t_begin, double compute_s, bool backward) {
  if (core.spans) core.spans->push_back(AttnSpan{t_begin, compute_s, core.layer, backward});
}

class LocalAttention : public AttentionCore {
 public:
  LocalAttention(const kernels::Ctx& ctx, int H, int Hkv, int D, int64_t window)
      : ctx_(ctx), H_(H), Hkv_(Hkv), D_(D), window_(window) {}
  kernels::AttnShape shape(int64_t Ls, const SeqDocs& docs) const {
    kernels::AttnShape s;
    s.Tq = s.Tk = Ls;
    s.H = H_;
    s.Hkv = Hkv_;
    s.D = D_;
    s.scale = 1.0f / std::sqrt(float(D_));
    s.causal = true;
    s.window = window_;
    if (docs.packed()) s.q_doc = s.k_doc = docs.device.data<int32_t>();  // device memory
    return s;
  }
  void forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t Ls, const Tensor& out,
               const Tensor& lse, const SeqDocs& docs) override {
    const double t0 = now_s();
    kernels::attention_forward(ctx_, shape(Ls, docs), q, k, v, out, lse);
    record(*this, t0, now_s() - t0, false);
  }
  void backward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t Ls, const Tensor& out,
                const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                const Tensor& dv, const SeqDocs& docs) override {
    const double t0 = now_s();
    kernels::fill(ctx_, dq, 0.0f);
    kernels::fill(ctx_, dk, 0.0f);
    kernels::fill(ctx_, dv, 0.0f);
    kernels::attention_backward(ctx_, shape(Ls, docs), q, k, v, out, lse, dout, dq, dk, dv);
    record(*this, t0, now_s() - t0, true);
  }

 private:
  kernels::Ctx ctx_;
  int H_, Hkv_, D_;
  int64_t window_;
};

// A distributed attention (ring, Ulysses) on f32 tensors of its device
// (their tensor overloads): bf16 inputs are widened first and a bf16 output
// is rounded after (see as_f32); the gradients and lse are f32 already. The
// timeline records the kernel time the implementation reports under
// "ring.forward" / "ring.backward".
class F32DistributedCore : public AttentionCore {
 public:
  explicit F32DistributedCore(const kernels::Ctx& ctx) : ctx_(ctx) {}
  void forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t, const Tensor& out,
               const Tensor& lse, const SeqDocs& docs) override {
    work_.clear();
    const double t0 = now_s();
    const Tensor q32 = as_f32(ctx_, q), k32 = as_f32(ctx_, k), v32 = as_f32(ctx_, v);
    const Tensor o32 = f32_out(ctx_, out);
    run_forward(q32, k32, v32, o32, lse, local_docs(docs));
    write_back(ctx_, o32, out);
    record(*this, t0, work_.seconds("ring.forward"), false);
  }
  void backward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t, const Tensor& out,
                const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                const Tensor& dv, const SeqDocs& docs) override {
    work_.clear();
    const double t0 = now_s();
    const Tensor q32 = as_f32(ctx_, q), k32 = as_f32(ctx_, k), v32 = as_f32(ctx_, v);
    const Tensor o32 = as_f32(ctx_, out), do32 = as_f32(ctx_, dout);
    run_backward(q32, k32, v32, o32, lse, do32, dq, dk, dv, local_docs(docs));
    record(*this, t0, work_.seconds("ring.backward"), true);
  }

 protected:
  static cp::LocalDocs local_docs(const SeqDocs& docs) {
    if (!docs.packed()) return {};
    return {docs.device.data<int32_t>(), docs.host, docs.layout};
  }
  virtual void run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                           const Tensor& lse, const cp::LocalDocs& docs) = 0;
  virtual void run_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            const Tensor& lse, const Tensor& dout, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, const cp::LocalDocs& docs) = 0;

  kernels::Ctx ctx_;
  prof::Recorder work_{false};  // the implementation's kernel time of the current call
};

// The sequence is split over the cp group: the ring passes K/V around it.
class RingAttentionCore : public F32DistributedCore {
 public:
  RingAttentionCore(const kernels::Ctx& ctx, const Config& cfg, Communicator* cp)
      : F32DistributedCore(ctx),
        ring_(cp, cfg.parallel.cp_layout, true, cfg.data.seq_len, ctx),
        H_(cfg.model.n_heads),
        Hkv_(cfg.model.n_kv_heads),
        D_(cfg.model.head_dim()) {
    ring_.set_profiler(&work_);
    ring_.set_window(cfg.model.window);
  }

 private:
  void run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, const cp::LocalDocs& docs) override {
    ring_.forward(q, k, v, H_, Hkv_, D_, out, lse, docs);
  }
  void run_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                    const Tensor& dv, const cp::LocalDocs& docs) override {
    ring_.backward(q, k, v, out, lse, dout, H_, Hkv_, D_, dq, dk, dv, docs);
  }

  cp::RingAttention ring_;
  int H_, Hkv_, D_;
};

// cp_mode ulysses / hybrid: all-to-all inside the Ulysses group, then the
// ring (cp/ulysses_attention.hpp).
class UlyssesAttentionCore : public F32DistributedCore {
 public:
  UlyssesAttentionCore(const kernels::Ctx& ctx, const Config& cfg, Communicator* cp)
      : F32DistributedCore(ctx),
        ulysses_(cp, cp::ulysses_size(cfg.parallel), cfg.parallel.cp_layout, true, cfg.data.seq_len,
                 cfg.model.n_heads, cfg.model.n_kv_heads, cfg.model.head_dim(), ctx) {
    ulysses_.set_profiler(&work_);
    ulysses_.set_window(cfg.model.window);
  }

 private:
  void run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                   const Tensor& lse, const cp::LocalDocs& docs) override {
    ulysses_.forward(q, k, v, out, lse, docs);
  }
  void run_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                    const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                    const Tensor& dv, const cp::LocalDocs& docs) override {
    ulysses_.backward(q, k, v, out, lse, dout, dq, dk, dv, docs);
  }

  cp::UlyssesAttention ulysses_;
};

}  // namespace

std::unique_ptr<AttentionCore> make_attention_core(const kernels::Ctx& ctx, const Config& cfg,
                                                   const StageComms& comms) {
  const auto& m = cfg.model;
  if (!comms.cp || comms.cp->size() == 1)
    return std::make_unique<LocalAttention>(ctx, m.n_heads, m.n_kv_heads, m.head_dim(), m.window);
  if (cp::ulysses_size(cfg.parallel) > 1)
    return std::make_unique<UlyssesAttentionCore>(ctx, cfg, comms.cp);
  return std::make_unique<RingAttentionCore>(ctx, cfg, comms.cp);
}

std::vector<int64_t> local_positions(const Config& cfg, const StageComms& comms) {
  std::vector<int64_t> pos(size_t(cfg.data.seq_len));
  std::iota(pos.begin(), pos.end(), 0);
  if (!comms.cp || comms.cp->size() == 1) return pos;
  const auto layout = cfg.parallel.cp_layout;
  cp::check_layout(cfg.data.seq_len, comms.cp->size(), layout);
  return cp::local_positions(cfg.data.seq_len, comms.cp->size(), comms.cp->rank(), layout,
                             cp::ulysses_size(cfg.parallel));
}

DocumentBalance document_balance(const Config& cfg, const StageComms& comms) {
  if (cfg.parallel.cp_layout != CpLayout::docs || !comms.cp || comms.cp->size() == 1 ||
      cp::ulysses_size(cfg.parallel) > 1)
    return {};
  return {comms.cp->size(), comms.cp->rank(), cfg.model.window};
}

}  // namespace trident::model
