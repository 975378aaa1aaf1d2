// The router's arithmetic for one token, shared by the CPU kernels (a loop
// over tokens) and the CUDA kernels (one thread per token), so that both
// backends score, choose, weigh and differentiate a token with the same
// operations in the same order and precision (definitions in router.hpp).
// Plain C math functions (expf, exp, log) exist on both sides.
#pragma once
#include <math.h>

#include <cstdint>

#include "trident/kernels/host_device.hpp"
#include "trident/kernels/router.hpp"

namespace trident::kernels::router_token {

// p[E] = the scores of one token's logits l[E]; returns its logsumexp.
TRIDENT_HD inline float scores(const float* l, int E, bool sigmoid, float* p) {
  float m = l[0];
  for (int e = 1; e < E; ++e)
    if (m < l[e]) m = l[e];
  double z = 0;
  for (int e = 0; e < E; ++e) z += exp(double(l[e]) - m);
  const float lse = static_cast<float>(m + log(z));
  for (int e = 0; e < E; ++e) p[e] = sigmoid ? 1.0f / (1.0f + expf(-l[e])) : expf(l[e] - lse);
  return lse;
}

// out[k] = the k largest of s + bias (bias nullptr: none), best first;
// strict comparison keeps the lower expert on ties (insertion into the
// k-long list: k is small, 1..8).
TRIDENT_HD inline void topk(const float* s, const float* bias, int E, int k, int* out) {
  int n = 0;
  for (int e = 0; e < E; ++e) {
    const float v = bias ? s[e] + bias[e] : s[e];
    int pos = n;
    while (pos > 0 && v > (bias ? s[out[pos - 1]] + bias[out[pos - 1]] : s[out[pos - 1]])) --pos;
    if (pos >= k) continue;
    for (int m = n < k - 1 ? n : k - 1; m > pos; --m) out[m] = out[m - 1];
    out[pos] = e;
    if (n < k) ++n;
  }
}

// chosen[k] = top-k of p + bias; weight[k] = their p, renormalised over the
// k when norm_topk.
TRIDENT_HD inline void choose(const RouterDims& dims, const float* p, const float* bias,
                              int* chosen, float* weight) {
  const int k = dims.k;
  topk(p, bias, dims.E, k, chosen);
  float sum = 0;
  for (int j = 0; j < k; ++j) sum += p[chosen[j]];
  for (int j = 0; j < k; ++j) weight[j] = dims.norm_topk ? p[chosen[j]] / sum : p[chosen[j]];
}

// Token t's terms of the aux and z losses.
TRIDENT_HD inline void loss_terms(const RouterDims& dims, const float* probs, const float* lse,
                                  const RouterLossTerms& terms, int64_t t, double* aux, double* z) {
  const int E = dims.E;
  const int s = terms.sample[t];
  const float* p = probs + t * E;
  const double* f = terms.f + int64_t(s) * E;
  double norm = 1.0;
  if (dims.score == RouterScore::sigmoid) {
    norm = 0;
    for (int e = 0; e < E; ++e) norm += p[e];
  }
  double fp = 0;
  for (int e = 0; e < E; ++e) fp += f[e] * (p[e] / norm);
  *aux = terms.aux_coef * E * fp * terms.inv_tokens[s];
  *z = terms.z_coef * double(lse[t]) * lse[t] * terms.inv_tokens[s];
}

// dp += the gradient through the routing weights of one token:
// w_j = p_cj / S (norm_topk) or p_cj.
TRIDENT_HD inline void weight_grad(const RouterDims& dims, const float* p, const int* c,
                                   const float* w, const float* dw, double* dp) {
  const int k = dims.k;
  if (!dims.norm_topk) {
    for (int j = 0; j < k; ++j) dp[c[j]] += dw[j];
    return;
  }
  double S = 0, dot = 0;
  for (int j = 0; j < k; ++j) {
    S += p[c[j]];
    dot += double(dw[j]) * w[j];
  }
  for (int j = 0; j < k; ++j) dp[c[j]] += (dw[j] - dot) / S;
}

// dlogits of token t (E floats, overwritten); dp: E doubles of scratch.
TRIDENT_HD inline void backward(const RouterDims& dims, const RouterSaved& saved,
                                const RouterLossTerms& terms, const float* dweight,
                                float daux_scale, int64_t t, double* dp, float* dlogits) {
  const int E = dims.E, k = dims.k;
  const float* p = saved.probs + t * E;
  const int s = terms.sample[t];
  const double* f = terms.f + int64_t(s) * E;
  for (int e = 0; e < E; ++e) dp[e] = 0.0;
  weight_grad(dims, p, saved.chosen + t * k, saved.weight + t * k, dweight + t * k, dp);
  // Through the aux loss: dL/dP_i = coef * E * f_i, P_i = mean of q_i.
  const double aux = double(daux_scale) * terms.aux_coef * E * terms.inv_tokens[s];
  float* dl = dlogits + t * E;
  if (dims.score != RouterScore::sigmoid) {
    for (int e = 0; e < E; ++e) dp[e] += aux * f[e];
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += dp[e] * p[e];
    for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (dp[e] - dot));
  } else {
    double norm = 0, dq_dot_q = 0;
    for (int e = 0; e < E; ++e) norm += p[e];
    for (int e = 0; e < E; ++e) dq_dot_q += aux * f[e] * (p[e] / norm);
    for (int e = 0; e < E; ++e) dp[e] += (aux * f[e] - dq_dot_q) / norm;
    for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(dp[e] * p[e] * (1.0 - p[e]));
  }
  // z-loss: d(lse^2)/dl_e = 2 * lse * softmax_e.
  if (terms.z_coef != 0) {
    const float lt = saved.lse[t];
    const double zs = double(daux_scale) * terms.z_coef * 2.0 * lt * terms.inv_tokens[s];
    const float* l = saved.logits + t * E;
    for (int e = 0; e < E; ++e) dl[e] += static_cast<float>(zs * exp(double(l[e]) - lt));
  }
}

}  // namespace trident::kernels::router_token
