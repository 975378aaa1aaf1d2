// Router: the routing decisions around the router kernels: statistics
// reduced over the CP group, capacity drops decided over the whole
// micro-batch, and the auxiliary-loss-free bias update.
#include "trident/parallel/ep/router.hpp"

#include <algorithm>
#include <cmath>

#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::ep {

RouterScoring parse_router_scoring(const std::string& name) {
  if (auto scoring = parse_config_name<RouterScoring>(name)) return *scoring;
  throw InputError("model.router: \"" + name + "\" is not one of \"softmax\", \"sigmoid_bias\"");
}

Router::Router(const RouterOptions& o) : o_(o) {
  TRIDENT_CHECK(o.n_experts > 0 && o.top_k >= 1 && o.top_k <= o.n_experts,
                "router: need 1 <= top_k <= n_experts");
  bias_.assign(o.n_experts, 0.0f);
}

kernels::RouterDims Router::dims(int64_t T) const {
  kernels::RouterDims d;
  d.T = T;
  d.E = o_.n_experts;
  d.k = o_.top_k;
  d.score = o_.scoring == RouterScoring::sigmoid_bias ? kernels::RouterScore::sigmoid
                                                      : kernels::RouterScore::softmax;
  d.norm_topk = o_.norm_topk;
  return d;
}

const Tensor& Router::device_bias(const kernels::Ctx& ctx) const {
  if (bias_stale_ || bias_device_.empty() || bias_device_.device() != ctx.device) {
    bias_device_ = kernels::from_host(ctx, bias_.data(), {o_.n_experts}, DType::f32);
    bias_stale_ = false;
  }
  return bias_device_;
}

kernels::RouterTensors Router::tensors(const Routing& r) const {
  kernels::RouterTensors t;
  t.logits = r.logits;
  t.probs = r.probs;
  t.lse = r.lse;
  t.chosen = r.chosen;
  t.weight = r.weight;
  t.sample = r.sample;
  t.f = r.f;
  t.inv_tokens = r.inv_tokens;
  t.aux_coef = o_.aux_loss_coef;
  t.z_coef = o_.z_loss_coef;
  return t;
}

void Router::route(const kernels::Ctx& ctx, const Tensor& logits, const Tensor& sample_of_token,
                   int n_samples, Communicator* cp, Routing& r, const Tensor* token_index) const {
  const int E = o_.n_experts, k = o_.top_k;
  const bool sig = o_.scoring == RouterScoring::sigmoid_bias;
  const int64_t T = logits.numel() / E;
  TRIDENT_CHECK(logits.numel() == T * E && logits.dtype() == DType::f32,
                "router: logits must be f32 [T, " + std::to_string(E) + "]");
  TRIDENT_CHECK(
      sample_of_token.numel() == T && sample_of_token.dtype() == DType::i32,
      "router: sample_of_token must be i32 with one entry per token (" + std::to_string(T) + ")");
  TRIDENT_CHECK(!token_index || (token_index->numel() == T && token_index->dtype() == DType::i64),
                "router: token_index must be i64 with one entry per token");
  if (ctx.device.is_cpu())  // elsewhere the ids are device memory, made by trident itself
    for (int64_t t = 0; t < T; ++t) {
      const int s = sample_of_token.data<int32_t>()[t];
      TRIDENT_CHECK(s >= 0 && s < n_samples, "router: sample id out of range");
    }
  const kernels::RouterDims dm = dims(T);
  r.T = T;
  r.logits = kernels::clone(ctx, logits);  // kept for the backward; never visits the host
  r.probs = kernels::empty(ctx, {T, E});
  r.lse = kernels::empty(ctx, {T});
  r.sample = sample_of_token;
  kernels::router_scores(ctx, dm, logits, r.probs, r.lse);
  r.chosen = kernels::empty(ctx, {T * k}, DType::i32);
  r.weight = kernels::empty(ctx, {T * k});
  kernels::router_topk(ctx, dm, r.probs, sig ? device_bias(ctx) : Tensor(), r.chosen, r.weight);

  // Per-sample statistics, summed over the CP ranks that share the samples.
  Tensor stats = kernels::empty(ctx, {int64_t(n_samples), E + 1}, DType::f64);
  kernels::router_load(ctx, dm, r.chosen, sample_of_token, stats);
  if (cp && cp->size() > 1) cp->allreduce_sum(stats.data<double>(), size_t(stats.numel()));
  r.f = kernels::empty(ctx, {int64_t(n_samples) * E}, DType::f64);
  r.inv_tokens = kernels::empty(ctx, {int64_t(n_samples)}, DType::f64);
  kernels::router_frequencies(ctx, dm, stats, r.f, r.inv_tokens);
  // The two loss shares come back to the host in one small copy.
  Tensor shares = kernels::empty(ctx, {2}, DType::f64);
  kernels::router_losses(ctx, dm, tensors(r), shares);
  const Tensor host = kernels::to_host(ctx, shares);
  r.aux_share = host.data<double>()[0];
  r.z_share = host.data<double>()[1];
  apply_capacity(ctx, r, cp, token_index);
}

void Router::route(const kernels::Ctx& ctx, const Tensor& logits,
                   const std::vector<int>& sample_of_token, int n_samples, Communicator* cp,
                   Routing& r, const std::vector<int64_t>* token_index) const {
  const int64_t T = static_cast<int64_t>(sample_of_token.size());
  TRIDENT_CHECK(logits.numel() == T * o_.n_experts,
                "router: sample_of_token has " + std::to_string(T) + " entries for logits " +
                    logits.shape_str() + " of " + std::to_string(o_.n_experts) + " experts");
  TRIDENT_CHECK(!token_index || int64_t(token_index->size()) == T,
                "router: token_index needs one entry per token");
  for (int s : sample_of_token)
    TRIDENT_CHECK(s >= 0 && s < n_samples, "router: sample id out of range");
  const Tensor l = kernels::clone(ctx, logits.reshape({T, o_.n_experts}));
  const Tensor s = kernels::from_host(ctx, sample_of_token.data(), {T}, DType::i32);
  Tensor ti;
  if (token_index) ti = kernels::from_host(ctx, token_index->data(), {T}, DType::i64);
  route(ctx, l, s, n_samples, cp, r, token_index ? &ti : nullptr);
}

void Router::apply_capacity(const kernels::Ctx& ctx, Routing& r, Communicator* cp,
                            const Tensor* token_index) const {
  const int E = o_.n_experts, k = o_.top_k;
  const int64_t T = r.T, n = T * k;
  r.expert = r.chosen;
  r.dropped = 0;
  r.capacity = 0;
  if (o_.capacity_factor <= 0) return;
  // Every copy of the micro-batch, from every rank of the group (in rank
  // order), so that each rank takes the decisions one rank would take.
  const bool split = cp && cp->size() > 1;
  const int ranks = split ? cp->size() : 1, me = split ? cp->rank() : 0;
  Tensor own_token;
  if (token_index) {
    own_token = *token_index;
  } else {
    std::vector<int64_t> t(static_cast<size_t>(T));
    for (int64_t i = 0; i < T; ++i) t[size_t(i)] = i;
    own_token = kernels::from_host(ctx, t.data(), {T}, DType::i64);
  }
  Tensor token = own_token, weight = r.weight, chosen = r.chosen;
  if (split) {
    token = kernels::empty(ctx, {T * ranks}, DType::i64);
    weight = kernels::empty(ctx, {n * ranks});
    chosen = kernels::empty(ctx, {n * ranks}, DType::i32);
    cp->allgather(own_token.data<int64_t>(), token.data<int64_t>(), sizeof(int64_t) * size_t(T));
    cp->allgather(r.weight.data<float>(), weight.data<float>(), sizeof(float) * size_t(n));
    cp->allgather(r.chosen.data<int32_t>(), chosen.data<int32_t>(), sizeof(int32_t) * size_t(n));
  }
  r.capacity = static_cast<int64_t>(std::ceil(o_.capacity_factor * double(T * ranks) * k / E));
  r.expert = kernels::empty(ctx, {n}, DType::i32);
  Tensor dropped = kernels::empty(ctx, {1}, DType::i64);
  kernels::router_capacity(ctx, dims(T), ranks, me, token, weight, chosen, r.capacity, r.expert,
                           dropped);
  r.dropped = kernels::to_host(ctx, dropped).data<int64_t>()[0];
}

void Router::backward(const kernels::Ctx& ctx, const Routing& r, const Tensor& dweight,
                      float daux_scale, const Tensor& dlogits) const {
  kernels::router_backward(ctx, dims(r.T), tensors(r), dweight, daux_scale, dlogits);
}

void Router::update_bias(const std::vector<int64_t>& load) {
  if (o_.scoring != RouterScoring::sigmoid_bias) return;
  TRIDENT_CHECK(static_cast<int>(load.size()) == o_.n_experts, "update_bias: load needs E entries");
  double mean = 0;
  for (auto v : load) mean += double(v);
  mean /= o_.n_experts;
  for (int e = 0; e < o_.n_experts; ++e) {
    const double diff = mean - double(load[e]);
    const float sign = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f);
    bias_[e] += static_cast<float>(o_.bias_rate) * sign;
  }
  bias_stale_ = true;
}

}  // namespace trident::ep
