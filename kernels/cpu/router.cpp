// Router kernels on the CPU: scores, top-k, loads, the aux and z losses and
// their gradient (definitions in router.hpp).
#include <algorithm>
#include <cmath>
#include <vector>

#include "trident/kernels/moe_backends.hpp"

namespace trident::kernels::cpu {

void router_scores(const Ctx&, const RouterDims& dims, const float* logits, float* probs,
                   float* lse) {
  const int E = dims.E;
  const bool sig = dims.score == RouterScore::sigmoid;
  for (int64_t t = 0; t < dims.T; ++t) {
    const float* l = logits + t * E;
    float* p = probs + t * E;
    float m = l[0];
    for (int e = 1; e < E; ++e) m = std::max(m, l[e]);
    double z = 0;
    for (int e = 0; e < E; ++e) z += std::exp(double(l[e]) - m);
    lse[t] = static_cast<float>(m + std::log(z));
    for (int e = 0; e < E; ++e)
      p[e] = sig ? 1.0f / (1.0f + std::exp(-l[e])) : std::exp(l[e] - lse[t]);
  }
}

void topk_rows(const Ctx&, const float* scores, const float* bias, int64_t T, int E, int k,
               int* idx) {
  for (int64_t t = 0; t < T; ++t) {
    const float* s = scores + t * E;
    int* out = idx + t * k;
    auto score = [&](int e) { return bias ? s[e] + bias[e] : s[e]; };
    // Insertion into a k-long sorted list: k is small (1..8), E modest.
    int n = 0;
    for (int e = 0; e < E; ++e) {
      const float v = score(e);
      int pos = n;
      while (pos > 0 && v > score(out[pos - 1])) --pos;  // strict: ties keep the lower index
      if (pos >= k) continue;
      for (int m = std::min(n, k - 1); m > pos; --m) out[m] = out[m - 1];
      out[pos] = e;
      if (n < k) ++n;
    }
  }
}

void router_topk(const Ctx& ctx, const RouterDims& dims, const float* probs, const float* bias,
                 int* chosen, float* weight) {
  const int E = dims.E, k = dims.k;
  cpu::topk_rows(ctx, probs, bias, dims.T, E, k, chosen);
  for (int64_t t = 0; t < dims.T; ++t) {
    const float* p = probs + t * E;
    const int* c = chosen + t * k;
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += p[c[j]];
    for (int j = 0; j < k; ++j) weight[t * k + j] = dims.norm_topk ? p[c[j]] / sum : p[c[j]];
  }
}

void router_load(const Ctx&, const RouterDims& dims, const int* chosen, const int* sample,
                 int n_samples, double* stats) {
  const int E = dims.E, k = dims.k;
  const size_t stride = size_t(E) + 1;
  std::fill(stats, stats + size_t(n_samples) * stride, 0.0);
  for (int64_t t = 0; t < dims.T; ++t) {
    double* st = stats + size_t(sample[t]) * stride;
    for (int j = 0; j < k; ++j) st[chosen[t * k + j]] += 1.0;
    st[E] += 1.0;
  }
}

void router_losses(const Ctx&, const RouterDims& dims, const float* probs, const float* lse,
                   const RouterLossTerms& terms, double* aux_share, double* z_share) {
  const int E = dims.E;
  const bool sig = dims.score == RouterScore::sigmoid;
  double aux = 0, z = 0;
  for (int64_t t = 0; t < dims.T; ++t) {
    const int s = terms.sample[t];
    const float* p = probs + t * E;
    const double* f = terms.f + size_t(s) * E;
    double norm = 1.0;
    if (sig) {
      norm = 0;
      for (int e = 0; e < E; ++e) norm += p[e];
    }
    double fp = 0;
    for (int e = 0; e < E; ++e) fp += f[e] * (p[e] / norm);
    aux += terms.aux_coef * E * fp * terms.inv_tokens[s];
    z += terms.z_coef * double(lse[t]) * lse[t] * terms.inv_tokens[s];
  }
  *aux_share = aux;
  *z_share = z;
}

namespace {

// dp += the gradient through the routing weights of one token:
// w_j = p_cj / S (norm_topk) or p_cj.
void weight_grad(const RouterDims& dims, const float* p, const int* c, const float* w,
                 const float* dw, double* dp) {
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

}  // namespace

void router_backward(const Ctx&, const RouterDims& dims, const RouterSaved& saved,
                     const RouterLossTerms& terms, const float* dweight, float daux_scale,
                     float* dlogits) {
  const int E = dims.E, k = dims.k;
  const bool sig = dims.score == RouterScore::sigmoid;
  std::vector<double> dp(static_cast<size_t>(E));
  for (int64_t t = 0; t < dims.T; ++t) {
    const float* p = saved.probs + t * E;
    const int s = terms.sample[t];
    const double* f = terms.f + size_t(s) * E;
    std::fill(dp.begin(), dp.end(), 0.0);
    weight_grad(dims, p, saved.chosen + t * k, saved.weight + t * k, dweight + t * k, dp.data());
    // Through the aux loss: dL/dP_i = coef * E * f_i, P_i = mean of q_i.
    const double aux = double(daux_scale) * terms.aux_coef * E * terms.inv_tokens[s];
    float* dl = dlogits + t * E;
    if (!sig) {
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
      const float lse = saved.lse[t];
      const double zs = double(daux_scale) * terms.z_coef * 2.0 * lse * terms.inv_tokens[s];
      const float* l = saved.logits + t * E;
      for (int e = 0; e < E; ++e) dl[e] += static_cast<float>(zs * std::exp(double(l[e]) - lse));
    }
  }
}

}  // namespace trident::kernels::cpu
