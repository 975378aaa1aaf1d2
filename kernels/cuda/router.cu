// Router kernels of kernels/router.hpp on the GPU: one thread per token runs
// the per-token arithmetic the CPU kernels share (router_token.hpp; E and k
// are small), in the same order and precision (fp64 statistics), so every
// token's scores, choices, weights and gradients match the CPU's. The loss
// shares are per-token terms summed in a fixed order; the loads are integer
// counts (exact in any order). Capacity drops sort the group's copies (two
// stable radix sorts, O(N) work per key bit) instead of comparing every pair.
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>
#include <limits>

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

// Capacity drops by sorting (router_capacity below): the group's N copies
// are sorted stably by (token, slot), then stably by (expert, weight
// descending), which leaves every expert's copies as one run in the total
// order of router.hpp. A copy's place among its expert's copies is its
// position minus where its expert's run starts.

// The (token, slot) key of copy i; tokens are indices in a micro-batch
// (0 <= token < 2^56), so token * k + slot does not overflow.
__global__ void token_key_kernel(const int64_t* token, int64_t N, int k, uint64_t* key, int* idx) {
  GRID_STRIDE(i, N) {
    key[i] = uint64_t(token[i / k]) * uint64_t(k) + uint64_t(i % k);
    idx[i] = int(i);
  }
}

// Unsigned keys in descending float order; -0 and +0 are one key, as they
// compare equal on the CPU.
__device__ uint32_t descending_weight_key(float w) {
  uint32_t u = __float_as_uint(w == 0.0f ? 0.0f : w);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // ascending float order
  return ~u;
}

__global__ void expert_key_kernel(const int* idx, const int* chosen, const float* weight, int64_t N,
                                  uint64_t* key) {
  GRID_STRIDE(p, N) {
    const int i = idx[p];
    key[p] = (uint64_t(uint32_t(chosen[i])) << 32) | descending_weight_key(weight[i]);
  }
}

// start[e]: where expert e's run begins in the sorted keys (set only for
// experts that have copies, the only ones read).
__global__ void expert_start_kernel(const uint64_t* key, int64_t N, int64_t* start) {
  GRID_STRIDE(p, N) {
    const uint64_t e = key[p] >> 32;
    if (p == 0 || (key[p - 1] >> 32) != e) start[e] = p;
  }
}

// Drops rank me's copies placed at or after `capacity` in their expert's run.
__global__ void drop_kernel(const uint64_t* key, const int* idx, int64_t N, const int64_t* start,
                            int64_t n, int me, int64_t capacity, int* expert,
                            unsigned long long* dropped) {
  GRID_STRIDE(p, N) {
    const int64_t i = idx[p];
    if (p - start[key[p] >> 32] < capacity || i / n != me) continue;
    expert[i % n] = -1;
    atomicAdd(dropped, 1ull);  // an integer count: exact in any order
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
  cudaStream_t s = stream_of(c);
  fill_zero(c, dropped, sizeof(int64_t));
  const int64_t n = dims.T * dims.k, N = n * ranks;
  if (n == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(expert, chosen + n * me, size_t(n) * sizeof(int),
                             cudaMemcpyDeviceToDevice, s));
  if (N <= capacity) return;  // no expert has more copies than it keeps
  TRIDENT_CHECK(N <= std::numeric_limits<int>::max(),
                "router_capacity: more than 2^31 - 1 copies in the group");
  const int items = int(N);
  int expert_bits = 1;
  while ((int64_t(1) << expert_bits) < dims.E) ++expert_bits;
  // Temporary storage of the two sorts (the larger of the two).
  size_t sort_bytes = 0;
  for (const int end_bit : {64, 32 + expert_bits}) {
    size_t b = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, b, static_cast<uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
        static_cast<int*>(nullptr), static_cast<int*>(nullptr), items, 0, end_bit, s));
    sort_bytes = std::max(sort_bytes, b);
  }
  // One scratch block: keys and indices twice each, expert starts, the
  // sorts' storage; not the workspace, which `expert` may be part of.
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t key_bytes = up(size_t(N) * sizeof(uint64_t)),
               idx_bytes = up(size_t(N) * sizeof(int));
  const size_t start_bytes = up(size_t(dims.E) * sizeof(int64_t));
  Scratch scratch(c, 2 * key_bytes + 2 * idx_bytes + start_bytes + sort_bytes, false);
  char* base = scratch.as<char>();
  auto* key_a = reinterpret_cast<uint64_t*>(base);
  auto* key_b = reinterpret_cast<uint64_t*>(base + key_bytes);
  auto* idx_a = reinterpret_cast<int*>(base + 2 * key_bytes);
  auto* idx_b = reinterpret_cast<int*>(base + 2 * key_bytes + idx_bytes);
  auto* start = reinterpret_cast<int64_t*>(base + 2 * key_bytes + 2 * idx_bytes);
  void* sort_tmp = base + 2 * key_bytes + 2 * idx_bytes + start_bytes;

  token_key_kernel<<<plan::grid_for(N), plan::kThreads, 0, s>>>(token, N, dims.k, key_a, idx_a);
  CUDA_CHECK_LAUNCH();
  size_t bytes = sort_bytes;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_tmp, bytes, key_a, key_b, idx_a, idx_b, items, 0,
                                             64, s));
  expert_key_kernel<<<plan::grid_for(N), plan::kThreads, 0, s>>>(idx_b, chosen, weight, N, key_a);
  CUDA_CHECK_LAUNCH();
  bytes = sort_bytes;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_tmp, bytes, key_a, key_b, idx_b, idx_a, items, 0,
                                             32 + expert_bits, s));
  expert_start_kernel<<<plan::grid_for(N), plan::kThreads, 0, s>>>(key_b, N, start);
  CUDA_CHECK_LAUNCH();
  drop_kernel<<<plan::grid_for(N), plan::kThreads, 0, s>>>(
      key_b, idx_a, N, start, n, me, capacity, expert,
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
