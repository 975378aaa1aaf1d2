// Router kernels of an MoE layer: scores from logits, top-k selection and
// routing weights, per-sample loads, the Switch load-balancing loss and the
// z-loss, and the gradient of all of it with respect to the logits.
//
// Row-major, T tokens by E experts. Scores are fp32; loss statistics are
// fp64 (they are sums over many tokens). Every loop runs tokens ascending,
// then experts or slots ascending, so results do not depend on how tokens
// are spread over ranks. What to route where (capacity, drops) and the
// reductions over ranks belong to the caller (parallel/ep).
//
// Definitions (s: the sample of token t, T_s its tokens, k slots):
//   softmax   p = softmax(logits)            sigmoid  p = sigmoid(logits)
//   lse_t     = logsumexp(logits_t) (for the z-loss, both scorings)
//   q         = p (softmax) or p / sum_e p (sigmoid): the probability share
//   f_{s,i}   = copies of sample s routed to i / (T_s * k)
//   aux share = sum_t aux_coef * E * sum_i f_{s,i} * q_{t,i} / T_s
//   z share   = sum_t z_coef * lse_t^2 / T_s
#pragma once
#include <cstdint>

#include "trident/kernels/context.hpp"
#include "trident/kernels/types/router.hpp"

namespace trident::kernels {

// RouterDims and RouterScore: kernels/types/router.hpp.

// probs [T, E] (p above) and lse [T], overwritten.
void router_scores(const Ctx& ctx, const RouterDims& dims, const float* logits, float* probs,
                   float* lse);

// For each of T rows of `scores` [T, E], the k largest of scores + bias
// (bias [E], nullptr: none), best first; ties go to the lower expert.
// idx [T, k].
void topk_rows(const Ctx& ctx, const float* scores, const float* bias, int64_t T, int E, int k,
               int* idx);

// chosen [T, k] = top-k of probs + bias (the bias only selects); weight
// [T, k] = the chosen probs, renormalised over the k when dims.norm_topk.
void router_topk(const Ctx& ctx, const RouterDims& dims, const float* probs, const float* bias,
                 int* chosen, float* weight);

// stats [n_samples, E + 1], overwritten: per sample, the chosen copies per
// expert, then the number of tokens. sample [T] in [0, n_samples).
void router_load(const Ctx& ctx, const RouterDims& dims, const int* chosen, const int* sample,
                 int n_samples, double* stats);

// The sample statistics the losses need, per sample s: f [n_samples, E]
// and inv_tokens [n_samples] (1 / T_s, 0 for an empty sample).
struct RouterLossTerms {
  const int* sample = nullptr;         // [T]
  const double* f = nullptr;           // [n_samples, E]
  const double* inv_tokens = nullptr;  // [n_samples]
  double aux_coef = 0, z_coef = 0;
};

// This call's tokens' shares of the aux and z losses (their sums over the
// ranks that hold parts of the samples are the losses).
void router_losses(const Ctx& ctx, const RouterDims& dims, const float* probs, const float* lse,
                   const RouterLossTerms& terms, double* aux_share, double* z_share);

// f [n_samples, E] and inv_tokens [n_samples] (RouterLossTerms) from the
// per-sample statistics stats [n_samples, E + 1] of router_load (summed over
// the ranks that share the samples): f = copies / (T_s k), inv = 1 / T_s,
// both 0 for an empty sample.
void router_frequencies(const Ctx& ctx, const RouterDims& dims, const double* stats, int n_samples,
                        double* f, double* inv_tokens);

// Capacity drops over the copies of a group of `ranks` ranks that route
// dims.T tokens each (rank r's part at r * T tokens, r * T * k copies):
// token [ranks * T] each token's index in the micro-batch the group shares,
// weight and chosen [ranks * T * k]. Each expert keeps the `capacity` copies
// that come first by (weight descending, token ascending, slot ascending),
// a total order. expert [T * k], overwritten: rank `me`'s chosen experts,
// -1 where the copy is dropped; dropped [1] (i64): how many of them.
void router_capacity(const Ctx& ctx, const RouterDims& dims, int ranks, int me,
                     const int64_t* token, const float* weight, const int* chosen, int64_t capacity,
                     int* expert, int64_t* dropped);

// The forward's values the backward reads.
struct RouterSaved {
  const float* logits = nullptr;  // [T, E]
  const float* probs = nullptr;   // [T, E]
  const float* lse = nullptr;     // [T]
  const int* chosen = nullptr;    // [T, k]
  const float* weight = nullptr;  // [T, k]
};

// dweight [T, k]: gradient of the loss w.r.t. the routing weights (0 for
// dropped copies); daux_scale: gradient w.r.t. the aux + z shares.
// dlogits [T, E], overwritten.
void router_backward(const Ctx& ctx, const RouterDims& dims, const RouterSaved& saved,
                     const RouterLossTerms& terms, const float* dweight, float daux_scale,
                     float* dlogits);

}  // namespace trident::kernels
