// Router kernels of kernels/router.hpp on the GPU: one thread per token runs
// the CPU kernel's per-token arithmetic (E and k are small), in the same
// order and precision (fp64 statistics), so every token's scores, choices,
// weights and gradients match the CPU's. The loss shares are per-token terms
// summed in a fixed order; the loads are integer counts (exact in any order).
#include "common.cuh"
#include "trident/kernels/moe_backends.hpp"

namespace trident::kernels::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__global__ void scores_kernel(RouterDims dims, const float* logits, float* probs, float* lse) {
  const int E = dims.E;
  const bool sig = dims.score == RouterScore::sigmoid;
  GRID_STRIDE(t, dims.T) {
    const float* l = logits + t * E;
    float* p = probs + t * E;
    float m = l[0];
    for (int e = 1; e < E; ++e) m = fmaxf(m, l[e]);
    double z = 0;
    for (int e = 0; e < E; ++e) z += exp(double(l[e]) - m);
    const float lt = float(m + log(z));
    lse[t] = lt;
    for (int e = 0; e < E; ++e) p[e] = sig ? 1.0f / (1.0f + expf(-l[e])) : expf(l[e] - lt);
  }
}

// The k largest of s + bias, best first; strict comparison keeps the lower
// expert on ties (insertion into the k-long list in `out`).
__device__ void topk_row(const float* s, const float* bias, int E, int k, int* out) {
  int n = 0;
  for (int e = 0; e < E; ++e) {
    const float v = bias ? s[e] + bias[e] : s[e];
    int pos = n;
    while (pos > 0 && v > (bias ? s[out[pos - 1]] + bias[out[pos - 1]] : s[out[pos - 1]])) --pos;
    if (pos >= k) continue;
    for (int m = min(n, k - 1); m > pos; --m) out[m] = out[m - 1];
    out[pos] = e;
    if (n < k) ++n;
  }
}

__global__ void topk_kernel(const float* scores, const float* bias, int64_t T, int E, int k,
                            int* idx) {
  GRID_STRIDE(t, T) topk_row(scores + t * E, bias, E, k, idx + t * k);
}

__global__ void router_topk_kernel(RouterDims dims, const float* probs, const float* bias,
                                   int* chosen, float* weight) {
  const int E = dims.E, k = dims.k;
  GRID_STRIDE(t, dims.T) {
    const float* p = probs + t * E;
    int* c = chosen + t * k;
    topk_row(p, bias, E, k, c);
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += p[c[j]];
    for (int j = 0; j < k; ++j) weight[t * k + j] = dims.norm_topk ? p[c[j]] / sum : p[c[j]];
  }
}

__global__ void load_kernel(RouterDims dims, const int* chosen, const int* sample, double* stats) {
  const int E = dims.E, k = dims.k;
  GRID_STRIDE(t, dims.T) {
    double* st = stats + int64_t(sample[t]) * (E + 1);
    for (int j = 0; j < k; ++j) atomicAdd(st + chosen[t * k + j], 1.0);
    atomicAdd(st + E, 1.0);
  }
}

// Per token: its aux and z terms (summed afterwards in token order).
__global__ void loss_terms_kernel(RouterDims dims, const float* probs, const float* lse,
                                  RouterLossTerms terms, double* aux, double* z) {
  const int E = dims.E;
  const bool sig = dims.score == RouterScore::sigmoid;
  GRID_STRIDE(t, dims.T) {
    const int s = terms.sample[t];
    const float* p = probs + t * E;
    const double* f = terms.f + int64_t(s) * E;
    double norm = 1.0;
    if (sig) {
      norm = 0;
      for (int e = 0; e < E; ++e) norm += p[e];
    }
    double fp = 0;
    for (int e = 0; e < E; ++e) fp += f[e] * (p[e] / norm);
    aux[t] = terms.aux_coef * E * fp * terms.inv_tokens[s];
    z[t] = terms.z_coef * double(lse[t]) * lse[t] * terms.inv_tokens[s];
  }
}

// out[0] = sum of a[0..n), out[1] = sum of b[0..n), each in a fixed order.
__global__ void sum_pairs_kernel(const double* a, const double* b, int64_t n, double* out_a,
                                 double* out_b) {
  __shared__ double red[32];
  double sa = 0.0, sb = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    sa += a[i];
    sb += b[i];
  }
  sa = block_sum(sa, red);
  sb = block_sum(sb, red);
  if (threadIdx.x == 0) {
    *out_a = sa;
    *out_b = sb;
  }
}

// dp (E doubles, this thread's scratch) += the gradient through the routing
// weights of one token: w_j = p_cj / S (norm_topk) or p_cj.
__device__ void weight_grad(const RouterDims& dims, const float* p, const int* c, const float* w,
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

// One thread per token; dp lives in the scratch [T, E] doubles.
__global__ void backward_kernel(RouterDims dims, RouterSaved saved, RouterLossTerms terms,
                                const float* dweight, float daux_scale, double* scratch,
                                float* dlogits) {
  const int E = dims.E, k = dims.k;
  const bool sig = dims.score == RouterScore::sigmoid;
  GRID_STRIDE(t, dims.T) {
    const float* p = saved.probs + t * E;
    const int s = terms.sample[t];
    const double* f = terms.f + int64_t(s) * E;
    double* dp = scratch + t * E;
    for (int e = 0; e < E; ++e) dp[e] = 0.0;
    weight_grad(dims, p, saved.chosen + t * k, saved.weight + t * k, dweight + t * k, dp);
    const double aux = double(daux_scale) * terms.aux_coef * E * terms.inv_tokens[s];
    float* dl = dlogits + t * E;
    if (!sig) {
      for (int e = 0; e < E; ++e) dp[e] += aux * f[e];
      double dot = 0;
      for (int e = 0; e < E; ++e) dot += dp[e] * p[e];
      for (int e = 0; e < E; ++e) dl[e] = float(p[e] * (dp[e] - dot));
    } else {
      double norm = 0, dq_dot_q = 0;
      for (int e = 0; e < E; ++e) norm += p[e];
      for (int e = 0; e < E; ++e) dq_dot_q += aux * f[e] * (p[e] / norm);
      for (int e = 0; e < E; ++e) dp[e] += (aux * f[e] - dq_dot_q) / norm;
      for (int e = 0; e < E; ++e) dl[e] = float(dp[e] * p[e] * (1.0 - p[e]));
    }
    if (terms.z_coef != 0) {  // d(lse^2)/dl_e = 2 * lse * softmax_e
      const float lt = saved.lse[t];
      const double zs = double(daux_scale) * terms.z_coef * 2.0 * lt * terms.inv_tokens[s];
      const float* l = saved.logits + t * E;
      for (int e = 0; e < E; ++e) dl[e] += float(zs * exp(double(l[e]) - lt));
    }
  }
}

#undef GRID_STRIDE

}  // namespace

void router_scores(const Ctx& c, const RouterDims& dims, const float* logits, float* probs,
                   float* lse) {
  if (dims.T == 0) return;
  scores_kernel<<<plan::grid_for(dims.T), plan::kThreads, 0, stream_of(c)>>>(dims, logits, probs,
                                                                             lse);
  CUDA_CHECK_LAUNCH();
}

void topk_rows(const Ctx& c, const float* scores, const float* bias, int64_t T, int E, int k,
               int* idx) {
  if (T == 0) return;
  TRIDENT_CHECK(k >= 1 && k <= E, "topk_rows: k must be in 1..E");
  topk_kernel<<<plan::grid_for(T), plan::kThreads, 0, stream_of(c)>>>(scores, bias, T, E, k, idx);
  CUDA_CHECK_LAUNCH();
}

void router_topk(const Ctx& c, const RouterDims& dims, const float* probs, const float* bias,
                 int* chosen, float* weight) {
  if (dims.T == 0) return;
  TRIDENT_CHECK(dims.k >= 1 && dims.k <= dims.E, "router_topk: k must be in 1..E");
  router_topk_kernel<<<plan::grid_for(dims.T), plan::kThreads, 0, stream_of(c)>>>(dims, probs, bias,
                                                                                  chosen, weight);
  CUDA_CHECK_LAUNCH();
}

void router_load(const Ctx& c, const RouterDims& dims, const int* chosen, const int* sample,
                 int n_samples, double* stats) {
  fill_zero(c, stats, size_t(n_samples) * size_t(dims.E + 1) * sizeof(double));
  if (dims.T == 0) return;
  load_kernel<<<plan::grid_for(dims.T), plan::kThreads, 0, stream_of(c)>>>(dims, chosen, sample,
                                                                           stats);
  CUDA_CHECK_LAUNCH();
}

void router_losses(const Ctx& c, const RouterDims& dims, const float* probs, const float* lse,
                   const RouterLossTerms& terms, double* aux_share, double* z_share) {
  if (dims.T == 0) {
    fill_zero(c, aux_share, sizeof(double));
    fill_zero(c, z_share, sizeof(double));
    return;
  }
  Scratch per_token(c, size_t(2 * dims.T) * sizeof(double));
  double* aux = per_token.as<double>();
  loss_terms_kernel<<<plan::grid_for(dims.T), plan::kThreads, 0, stream_of(c)>>>(
      dims, probs, lse, terms, aux, aux + dims.T);
  CUDA_CHECK_LAUNCH();
  sum_pairs_kernel<<<1, plan::kThreads, 0, stream_of(c)>>>(aux, aux + dims.T, dims.T, aux_share,
                                                           z_share);
  CUDA_CHECK_LAUNCH();
}

void router_backward(const Ctx& c, const RouterDims& dims, const RouterSaved& saved,
                     const RouterLossTerms& terms, const float* dweight, float daux_scale,
                     float* dlogits) {
  if (dims.T == 0) return;
  Scratch dp(c, size_t(dims.T) * size_t(dims.E) * sizeof(double));
  backward_kernel<<<plan::grid_for(dims.T), plan::kThreads, 0, stream_of(c)>>>(
      dims, saved, terms, dweight, daux_scale, dp.as<double>(), dlogits);
  CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
