// Router kernels of kernels/router.hpp on the GPU: one thread per token runs
// the per-token arithmetic the CPU kernels share (router_token.hpp; E and k
// are small), in the same order and precision (fp64 statistics), so every
// token's scores, choices, weights and gradients match the CPU's. The loss
// shares are per-token terms summed in a fixed order; the loads are integer
// counts (exact in any order).
#include "common.cuh"
#include "trident/kernels/moe_backends.hpp"
#include "trident/kernels/router_token.hpp"

namespace trident::kernels::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__global__ void scores_kernel(RouterDims dims, const float* logits, float* probs, float* lse) {
  const int E = dims.E;
  const bool sig = dims.score == RouterScore::sigmoid;
  GRID_STRIDE(t, dims.T) lse[t] = router_token::scores(logits + t * E, E, sig, probs + t * E);
}

__global__ void topk_kernel(const float* scores, const float* bias, int64_t T, int E, int k,
                            int* idx) {
  GRID_STRIDE(t, T) router_token::topk(scores + t * E, bias, E, k, idx + t * k);
}

__global__ void router_topk_kernel(RouterDims dims, const float* probs, const float* bias,
                                   int* chosen, float* weight) {
  const int E = dims.E, k = dims.k;
  GRID_STRIDE(t, dims.T) {
    router_token::choose(dims, probs + t * E, bias, chosen + t * k, weight + t * k);
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

__global__ void frequencies_kernel(RouterDims dims, const double* stats, int n_samples, double* f,
                                   double* inv_tokens) {
  const int E = dims.E;
  GRID_STRIDE(s, n_samples) {
    const double Ts = stats[s * (E + 1) + E];
    inv_tokens[s] = Ts == 0 ? 0.0 : 1.0 / Ts;
    for (int e = 0; e < E; ++e)
      f[s * E + e] = Ts == 0 ? 0.0 : stats[s * (E + 1) + e] / (Ts * dims.k);
  }
}

// One thread per copy of rank `me`: its place among its expert's copies is
// the number of copies of that expert that come before it in the order of
// router.hpp (a total order, so the places are those of a sort). O(n * N)
// comparisons, run only when capacity_factor > 0.
__global__ void capacity_kernel(RouterDims dims, int ranks, int me, const int64_t* token,
                                const float* weight, const int* chosen, int64_t capacity,
                                int* expert, unsigned long long* dropped) {
  const int k = dims.k;
  const int64_t n = dims.T * k, N = n * ranks;
  GRID_STRIDE(m, n) {
    const int64_t i = n * me + m;
    const int e = chosen[i];
    const float w = weight[i];
    const int64_t tok = token[i / k];
    int64_t place = 0;
    for (int64_t j = 0; j < N && place < capacity; ++j) {
      if (j == i || chosen[j] != e) continue;
      const float wj = weight[j];
      const int64_t tj = token[j / k];
      if (wj > w || (wj == w && (tj < tok || (tj == tok && j % k < i % k)))) ++place;
    }
    const bool keep = place < capacity;
    expert[m] = keep ? e : -1;
    if (!keep) atomicAdd(dropped, 1ull);
  }
}

// Per token: its aux and z terms (summed afterwards in token order).
__global__ void loss_terms_kernel(RouterDims dims, const float* probs, const float* lse,
                                  RouterLossTerms terms, double* aux, double* z) {
  GRID_STRIDE(t, dims.T) router_token::loss_terms(dims, probs, lse, terms, t, aux + t, z + t);
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

// One thread per token; dp lives in the scratch [T, E] doubles.
__global__ void backward_kernel(RouterDims dims, RouterSaved saved, RouterLossTerms terms,
                                const float* dweight, float daux_scale, double* scratch,
                                float* dlogits) {
  GRID_STRIDE(t, dims.T) {
    router_token::backward(dims, saved, terms, dweight, daux_scale, t, scratch + t * dims.E,
                           dlogits);
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

void router_frequencies(const Ctx& c, const RouterDims& dims, const double* stats, int n_samples,
                        double* f, double* inv_tokens) {
  if (n_samples == 0) return;
  frequencies_kernel<<<plan::grid_for(n_samples), plan::kThreads, 0, stream_of(c)>>>(
      dims, stats, n_samples, f, inv_tokens);
  CUDA_CHECK_LAUNCH();
}

void router_capacity(const Ctx& c, const RouterDims& dims, int ranks, int me, const int64_t* token,
                     const float* weight, const int* chosen, int64_t capacity, int* expert,
                     int64_t* dropped) {
  static_assert(sizeof(unsigned long long) == sizeof(int64_t), "the count is 64-bit");
  fill_zero(c, dropped, sizeof(int64_t));
  const int64_t n = dims.T * dims.k;
  if (n == 0) return;
  capacity_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(
      dims, ranks, me, token, weight, chosen, capacity, expert,
      reinterpret_cast<unsigned long long*>(dropped));
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
