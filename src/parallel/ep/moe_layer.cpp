// MoELayer: forward and backward of router + dispatch + experts + combine.
#include "trident/parallel/ep/moe_layer.hpp"

#include <algorithm>
#include <string>

#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::ep {

double MoEStats::imbalance() const {
  int64_t mx = 0, sum = 0;
  for (auto v : tokens_per_expert) {
    mx = std::max(mx, v);
    sum += v;
  }
  if (sum == 0 || tokens_per_expert.empty()) return 0.0;
  return double(mx) / (double(sum) / double(tokens_per_expert.size()));
}

namespace {
RouterOptions router_options(const ModelConfig& cfg) {
  RouterOptions o;
  o.n_experts = cfg.n_experts;
  o.top_k = cfg.top_k;
  o.scoring = cfg.router;
  o.norm_topk = cfg.norm_topk;
  o.aux_loss_coef = cfg.aux_loss_coef;
  o.z_loss_coef = cfg.z_loss_coef;
  o.capacity_factor = cfg.capacity_factor;
  o.bias_rate = cfg.router_bias_rate;
  return o;
}
int ep_size_of(Communicator* ep) { return ep ? ep->size() : 1; }

// The layer's experts: a SwiGLU MLP per local expert on the weights the
// GEMMs read (expert_gemm_weight); weight gradients accumulate into the
// parameters (fp32).
class SwigluExperts final : public ExpertBlockFn {
 public:
  SwigluExperts(MoELayer& layer, const kernels::Ctx& ctx) : layer_(layer), ctx_(ctx) {}
  void forward(int e, const Tensor& x, const Tensor& y, const Tensor& gate,
               const Tensor& up) override {
    kernels::swiglu_forward(ctx_, x, layer_.expert_gemm_weight(e, 0),
                            layer_.expert_gemm_weight(e, 1), layer_.expert_gemm_weight(e, 2), y,
                            gate, up, layer_.expert_packed_weights(e));
  }
  void backward(int e, const Tensor& x, const Tensor& gate, const Tensor& up, const Tensor& dy,
                const Tensor& dx) override {
    Param &wg = layer_.expert_param(e, 0), &wu = layer_.expert_param(e, 1),
          &wd = layer_.expert_param(e, 2);
    kernels::swiglu_backward(ctx_, x, gate, up, dy, layer_.expert_gemm_weight(e, 0),
                             layer_.expert_gemm_weight(e, 1), layer_.expert_gemm_weight(e, 2), dx,
                             wg.grad, wu.grad, wd.grad, layer_.expert_packed_weights(e));
  }

 private:
  MoELayer& layer_;
  kernels::Ctx ctx_;
};

int ep_rank_of(Communicator* ep) { return ep ? ep->rank() : 0; }
}  // namespace

MoELayer::MoELayer(const ModelConfig& cfg, int layer_index, Communicator* ep, Communicator* cp,
                   EpTransportChoice transport, double shm_limit_bytes, const kernels::Ctx& ctx)
    : ctx_(ctx),
      d_(cfg.d_model),
      f_(cfg.expert_ffn_hidden()),
      E_(cfg.n_experts),
      k_(cfg.top_k),
      L_(cfg.n_experts / std::max(1, ep_size_of(ep))),
      first_(ep_rank_of(ep) * L_),
      router_(router_options(cfg)),
      dispatcher_(ep, cfg.n_experts, transport, shm_limit_bytes, ctx),
      cp_(cp),
      swiglu_(std::make_unique<SwigluExperts>(*this, ctx)),
      expert_fn_(swiglu_.get()) {
  const std::string base = "layers." + std::to_string(layer_index) + ".moe.";
  router_w_ = Param(base + "router", {E_, d_}, GradReduce::dense);
  router_w_.init_normal_in_out_keyed(static_cast<float>(cfg.init_std));
  bias_ = Param(base + "router_bias", {E_}, GradReduce::none);
  bias_.decay = false;
  static const char* kNames[3] = {"w_gate", "w_up", "w_down"};
  experts_.reserve(static_cast<size_t>(L_) * 3);
  for (int e = 0; e < L_; ++e) {
    for (int w = 0; w < 3; ++w) {
      std::vector<int64_t> shape =
          w < 2 ? std::vector<int64_t>{f_, d_} : std::vector<int64_t>{d_, f_};
      experts_.emplace_back(base + "experts." + std::to_string(first_ + e) + "." + kNames[w], shape,
                            GradReduce::expert);
      experts_.back().init_normal_in_out_keyed(static_cast<float>(cfg.init_std));
    }
  }
}

MoELayer::~MoELayer() = default;

std::vector<Param*> MoELayer::params() {
  std::vector<Param*> out{&router_w_};
  for (auto& p : experts_) out.push_back(&p);
  return out;
}

std::vector<Param*> MoELayer::buffers() {
  if (router_.options().scoring != RouterScoring::sigmoid_bias) return {};
  // The bias lives in the router; mirror it so a checkpoint sees current values.
  std::copy(router_.bias().begin(), router_.bias().end(), bias_.value.ptr());
  return {&bias_};
}

Param& MoELayer::expert_param(int local_expert, int which) {
  return experts_.at(static_cast<size_t>(local_expert) * 3 + which);
}

const Tensor& MoELayer::expert_gemm_weight(int local_expert, int which) {
  const Param& p = expert_param(local_expert, which);
  return gemm_weight_ ? gemm_weight_(p) : p.value;
}

void MoELayer::set_expert_activations(DType dtype) {
  TRIDENT_CHECK(
      dtype == DType::f32 || dtype == DType::bf16,
      std::string("MoELayer: expert activations must be f32 or bf16, not ") + dtype_name(dtype));
  act_ = dtype;
}

// The experts' input rows in their dtype: the dispatched rows themselves, or
// a bf16 copy of them (one rounding pass, where every GEMM that reads them
// would round them again as it packs them).
Tensor MoELayer::expert_inputs(const Tensor& rows) const {
  if (act_ == DType::f32) return rows;
  Tensor x = kernels::empty(ctx_, rows.shape(), act_);
  kernels::convert(ctx_, rows, x);
  return x;
}

// c.rows and the experts' inputs c.expert_x: under bf16 at ep = 1 the
// token rows gathered straight into bf16 (one pass; the bits of the f32
// gather and its rounding), elsewhere dispatched f32 and rounded after.
void MoELayer::dispatch_inputs(Cache& c) {
  if (act_ != DType::f32 && dispatcher_.transport() == EpTransport::local) {
    Tensor x = kernels::empty(ctx_, {c.plan.received(), d_}, act_);
    c.rows = dispatcher_.dispatch_forward_into(c.plan, c.x, x);
    if (c.rows) {
      c.expert_x = x;
      return;
    }
  }
  c.rows = dispatcher_.dispatch_forward(c.plan, c.x);
  c.expert_x = expert_inputs(c.rows->in());
}

kernels::SwigluPacked MoELayer::expert_packed_weights(int local_expert) {
  if (!packed_weight_) return {};
  return {packed_weight_(expert_param(local_expert, 0)),
          packed_weight_(expert_param(local_expert, 1)),
          packed_weight_(expert_param(local_expert, 2))};
}

void MoELayer::run_experts_forward(Cache& c, const Tensor& out) {
  const DispatchPlan& p = c.plan;
  const Tensor& in = c.expert_x;
  for (int e = 0; e < L_; ++e) {
    for (int r = 0; r < p.ep_size; ++r) {
      const int64_t rows = p.chunk_rows[r * L_ + e], off = p.chunk_offset[r * L_ + e];
      if (rows == 0) continue;
      expert_fn_->forward(e, in.rows(off, off + rows), out.rows(off, off + rows),
                          c.gate.rows(off, off + rows), c.up.rows(off, off + rows));
    }
  }
}

void MoELayer::forward(const Tensor& x, const Tensor& sample_of_token, int n_samples,
                       const Tensor& y, Cache& c, MoEStats& stats, const Tensor* token_index) {
  TRIDENT_CHECK(
      x.dtype() == DType::f32 && x.ndim() >= 1 && x.dim(-1) == d_ && y.numel() == x.numel(),
      "MoELayer: x and y must be f32 [T, " + std::to_string(d_) + "], got x " + x.shape_str() +
          ", y " + y.shape_str());
  const int64_t T = x.numel() / d_;
  c.n_samples = n_samples;
  c.x = x.reshape({T, d_});
  const Tensor out = y.reshape({T, d_});
  Tensor logits = kernels::empty(ctx_, {T, E_});
  kernels::linear_forward(ctx_, c.x, router_w_.value, logits);
  router_.route(ctx_, logits, sample_of_token, n_samples, cp_, c.routing, token_index);

  c.plan = dispatcher_.plan(c.routing.expert, T, k_);
  const int64_t R = c.plan.received();
  dispatch_inputs(c);
  c.gate = kernels::empty(ctx_, {R, f_}, act_);
  c.up = kernels::empty(ctx_, {R, f_}, act_);
  run_experts_forward(c, c.rows->out());
  dispatcher_.combine_forward(c.plan, *c.rows, c.routing.weight, out);

  stats.aux_loss_sum = c.routing.aux_share;
  stats.z_loss_sum = c.routing.z_share;
  stats.tokens_per_expert = c.plan.tokens_per_expert;
  stats.dropped = c.routing.dropped;
}

void MoELayer::forward(const Tensor& x, const std::vector<int>& sample_of_token, int n_samples,
                       const Tensor& y, Cache& c, MoEStats& stats,
                       const std::vector<int64_t>* token_index) {
  const int64_t T = static_cast<int64_t>(sample_of_token.size());
  TRIDENT_CHECK(x.numel() == T * d_, "MoELayer: sample_of_token has " + std::to_string(T) +
                                         " entries for x " + x.shape_str() + " (rows of d " +
                                         std::to_string(d_) + ")");
  for (int s : sample_of_token)
    TRIDENT_CHECK(s >= 0 && s < n_samples, "MoELayer: sample id out of range");
  TRIDENT_CHECK(!token_index || int64_t(token_index->size()) == T,
                "MoELayer: token_index needs one entry per token");
  const Tensor s = kernels::from_host(ctx_, sample_of_token.data(), {T}, DType::i32);
  Tensor ti;
  if (token_index) ti = kernels::from_host(ctx_, token_index->data(), {T}, DType::i64);
  forward(x, s, n_samples, y, c, stats, token_index ? &ti : nullptr);
}

// Each expert's rows are one block; the SwiGLU runs per source chunk of it,
// in source order, so that the weight gradients add up in a fixed order.
void MoELayer::run_experts_backward(Cache& c, const Tensor& dout, const Tensor& din) {
  const DispatchPlan& p = c.plan;
  const Tensor& in = c.expert_x;
  for (int e = 0; e < L_; ++e) {
    for (int r = 0; r < p.ep_size; ++r) {
      const int64_t rows = p.chunk_rows[r * L_ + e], off = p.chunk_offset[r * L_ + e];
      if (rows == 0) continue;
      expert_fn_->backward(e, in.rows(off, off + rows), c.gate.rows(off, off + rows),
                           c.up.rows(off, off + rows), dout.rows(off, off + rows),
                           din.rows(off, off + rows));
    }
  }
}

void MoELayer::backward(const Tensor& dy, const Tensor& dx, Cache& c, float daux_scale) {
  const DispatchPlan& p = c.plan;
  const int64_t T = p.T, S = p.sent(), R = p.received();
  TRIDENT_CHECK(dy.numel() == T * d_ && dx.numel() == T * d_,
                "MoELayer: dy and dx must be [T, d] as the forward's x, got dy " + dy.shape_str() +
                    ", dx " + dx.shape_str());
  const Tensor dy_rows = dy.reshape({T, d_}), dx_rows = dx.reshape({T, d_});
  // Backward of the combine: w * dy to each copy's row, dy . row to its weight.
  Tensor drows = kernels::empty(ctx_, {S, d_});
  Tensor dweight = kernels::empty(ctx_, {T, k_});
  dispatcher_.combine_backward(p, *c.rows, dy_rows, c.routing.weight, drows, dweight);
  Tensor dout = dispatcher_.to_expert_side(p, drows);
  Tensor din = kernels::empty(ctx_, {R, d_});
  run_experts_backward(c, dout, din);
  // Backward of the dispatch: each token's copies summed back.
  dispatcher_.combine(p, din, Tensor(), dx_rows);

  Tensor dlogits = kernels::empty(ctx_, {T, E_});
  router_.backward(ctx_, c.routing, dweight, daux_scale, dlogits);
  kernels::linear_backward_weight(ctx_, dlogits, c.x, router_w_.grad);
  kernels::linear_backward_input(ctx_, dlogits, router_w_.value, dx_rows, 1.0f);
  c.rows.reset();  // after the backward's transfers: no peer reads these rows any more
  c.expert_x = Tensor();
}

void MoELayer::drop_expert_activations(Cache& c) {
  c.gate = Tensor();
  c.up = Tensor();
}

void MoELayer::recompute_expert_activations(Cache& c) {
  const int64_t R = c.plan.received();
  c.gate = kernels::empty(ctx_, {R, f_}, act_);
  c.up = kernels::empty(ctx_, {R, f_}, act_);
  Tensor discarded = kernels::empty(ctx_, {R, d_});  // the experts' outputs, kept in rows
  run_experts_forward(c, discarded);
}

void MoELayer::update_bias(const std::vector<int64_t>& global_load) {
  router_.update_bias(global_load);
}

}  // namespace trident::ep
