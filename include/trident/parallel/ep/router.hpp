// Router of an MoE layer: from fp32 logits [T, E] to the k experts of each
// token and their weights, the load-balancing losses, and capacity drops.
// The maths are the router ops on tensors (kernels/functional.hpp, with
// their semantics in kernels/router.hpp); this layer reduces the
// statistics over the CP group and decides what capacity drops.
//
// Scoring:
//   softmax       p = softmax(logits); top-k of p; weights p (renormalised
//                 over the chosen k when norm_topk).
//   sigmoid_bias  s = sigmoid(logits); top-k of s + bias, the bias only
//                 selects; weights s (renormalised when norm_topk). The bias
//                 moves by rate * sign(mean load - load) after each step
//                 (auxiliary-loss-free balancing).
// Aux loss (Switch): per sequence s, L_s = coef * E * sum_i f_i * P_i with
//   f_i = copies routed to i / (T_s * k) and P_i = mean probability of i
//   (softmax p, or s normalised to sum 1 for sigmoid_bias). f and T_s are
//   summed over the CP ranks that hold the sequence. P_i is a sum over
//   tokens, so each rank returns its own tokens' part and the parts over all
//   ranks add up to sum_s L_s. z-loss: z_coef * mean over the sequence of
//   logsumexp(logits)^2, split the same way.
// Capacity (capacity_factor > 0): each expert keeps at most
//   ceil(cf * T * k / E) copies of the micro-batch's T tokens, the highest
//   routing weights first (ties: lower token, then lower slot); a dropped
//   copy adds nothing and the token keeps its residual. T and the token
//   order are those of the whole micro-batch that the CP group shares (its
//   sequences whole, as one rank holds them), so the drops do not depend on
//   the cp split or layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/functional.hpp"

namespace trident::ep {

using RouterScoring = trident::RouterScoring;                 // model.router
RouterScoring parse_router_scoring(const std::string& name);  // InputError on unknown

struct RouterOptions {
  int n_experts = 8;
  int top_k = 2;
  RouterScoring scoring = RouterScoring::softmax;
  bool norm_topk = true;
  double aux_loss_coef = 0.0;
  double z_loss_coef = 0.0;
  double capacity_factor = 0.0;  // 0: dropless
  double bias_rate = 1e-3;
};

// One forward's routing, kept for backward. Every tensor lives on the
// routing ctx's device; the host holds only the scalars below, each brought
// back by one small copy.
struct Routing {
  int64_t T = 0;
  Tensor logits;      // f32 [T, E] as given, copied
  Tensor probs;       // f32 [T, E] softmax p or sigmoid s
  Tensor lse;         // f32 [T] logsumexp of logits (z-loss)
  Tensor chosen;      // i32 [T*k] top-k experts, best first
  Tensor expert;      // i32 [T*k] chosen, or -1 where capacity dropped the copy
                      //     (chosen itself when dropless)
  Tensor weight;      // f32 [T*k] routing weights of the chosen copies
  Tensor sample;      // i32 [T] sample of each token (the caller's tensor)
  Tensor f;           // f64 [n_samples * E] f_i of each sample (CP-global)
  Tensor inv_tokens;  // f64 [n_samples] 1 / T_s (CP-global; 0 for an empty sample)
  double aux_share = 0, z_share = 0;
  int64_t dropped = 0;
  int64_t capacity = 0;
};

class Router {
 public:
  explicit Router(const RouterOptions& o);

  // logits f32 [T, E]; sample_of_token i32 [T] in [0, n_samples), both on
  // ctx's device. cp: nullptr or the CP group that shares the sequences
  // (aux/z statistics are summed over it, capacity is decided over it).
  // token_index i64 [T] on ctx's device: each token's index in the
  // micro-batch as one rank holds it (sample * seq_len + global position);
  // nullptr: t. Every rank of cp routes the same number of tokens.
  void route(const kernels::Ctx& ctx, const Tensor& logits, const Tensor& sample_of_token,
             int n_samples, Communicator* cp, Routing& r,
             const Tensor* token_index = nullptr) const;
  // The same with the index data on the host (tests and benchmarks): T =
  // sample_of_token.size(); logits f32 [T, E] on the host or ctx's device;
  // all uploaded to ctx's device first.
  void route(const kernels::Ctx& ctx, const Tensor& logits, const std::vector<int>& sample_of_token,
             int n_samples, Communicator* cp, Routing& r,
             const std::vector<int64_t>* token_index = nullptr) const;

  // dweight [T*k] (gradient of the loss w.r.t. the weights; 0 for dropped
  // copies) and daux_scale (gradient w.r.t. the returned aux + z shares)
  // -> dlogits [T, E], overwritten; both on ctx's device.
  void backward(const kernels::Ctx& ctx, const Routing& r, const Tensor& dweight, float daux_scale,
                const Tensor& dlogits) const;

  // sigmoid_bias: bias_i += rate * sign(mean(load) - load_i); load = copies
  // per expert summed over the whole global batch. No-op for softmax.
  void update_bias(const std::vector<int64_t>& load);

  const RouterOptions& options() const { return o_; }
  // The bias on the host (a checkpoint's buffer); writing through the
  // non-const one uploads it again before the next route.
  std::vector<float>& bias() {
    bias_stale_ = true;
    return bias_;
  }
  const std::vector<float>& bias() const { return bias_; }

 private:
  kernels::RouterDims dims(int64_t T) const;
  // r.expert from r.chosen: the copies over capacity dropped (see above).
  void apply_capacity(const kernels::Ctx& ctx, Routing& r, Communicator* cp,
                      const Tensor* token_index) const;
  // The bias on ctx's device, uploaded when the host's has changed.
  const Tensor& device_bias(const kernels::Ctx& ctx) const;
  // r's tensors and the loss coefficients, as the router ops read them.
  kernels::RouterTensors tensors(const Routing& r) const;

  RouterOptions o_;
  std::vector<float> bias_;  // [E], sigmoid_bias only
  mutable Tensor bias_device_;
  mutable bool bias_stale_ = true;
};

}  // namespace trident::ep
