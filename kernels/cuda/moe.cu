// MoE token kernels of kernels/moe.hpp on the GPU: the expert-major gather
// (permute), the weighted combine (unpermute) over one buffer or per-expert
// segments, and their backward passes. Every sum over a token's k copies runs
// in slot order, as on the CPU, so a token's result does not depend on where
// its copies were computed.
#include <cub/block/block_scan.cuh>

#include "common.cuh"
#include "trident/kernels/moe_backends.hpp"

namespace trident::kernels::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// RowSource's row lookup on the device (its base and first arrays are device
// memory): the segment s with first[s] <= r < first[s + 1].
__device__ const float* source_row(const RowSource& src, int64_t r, int64_t d) {
  if (src.segments == 0) return src.rows + r * d;
  int lo = 0, hi = src.segments - 1;
  while (lo < hi) {  // the last segment whose first row is <= r
    const int mid = (lo + hi + 1) / 2;
    if (src.first[mid] <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  return src.base[lo] + (r - src.first[lo]) * d;
}

__global__ void gather_kernel(const float* x, int64_t d, const int64_t* src_row, int64_t n,
                              float* out) {
  GRID_STRIDE(e, n * d) out[e] = x[src_row[e / d] * d + e % d];
}

// y[t, c] = sum over slots j (in order) of w[t, j] * rows[row[t, j], c];
// w null: weights 1 (the scatter-add of the gather's backward).
__global__ void combine_kernel(RowSource rows, int64_t d, const int64_t* row, const float* weight,
                               int64_t T, int k, float* y) {
  GRID_STRIDE(e, T * d) {
    const int64_t t = e / d, c = e % d;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      if (r < 0) continue;
      acc += (weight ? weight[t * k + j] : 1.0f) * source_row(rows, r, d)[c];
    }
    y[e] = acc;
  }
}

// One warp per (token, slot): drows[row] = w * dy[t], dweight = <dy[t], rows[row]>
// accumulated in fp64 as on the CPU.
__global__ void combine_backward_kernel(RowSource rows, const float* dy, int64_t d,
                                        const int64_t* row, const float* weight, int64_t T, int k,
                                        float* drows, float* dweight) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= T * k) return;  // whole warps leave together
  const int64_t t = w / k, r = row[w];
  if (r < 0) {
    if (lane == 0) dweight[w] = 0.0f;
    return;
  }
  const float* src = source_row(rows, r, d);
  double dot = 0.0;
  for (int64_t c = lane; c < d; c += 32) {
    dot += double(dy[t * d + c]) * double(src[c]);
    drows[r * d + c] = weight[w] * dy[t * d + c];
  }
  dot = warp_sum(dot);
  if (lane == 0) dweight[w] = float(dot);
}

// counts[e] += 1 for every kept copy (integer counts: exact in any order).
__global__ void counts_kernel(const int* expert, int64_t n, int E, unsigned long long* counts) {
  GRID_STRIDE(i, n) {
    const int e = expert[i];
    if (e >= 0 && e < E) atomicAdd(counts + e, 1ull);
  }
}

// One block per expert, and one more for the dropped copies. An expert's
// block walks the copies in tiles of kOrderBlock: each thread flags whether
// its copy went to the expert, an exclusive block scan of the flags gives
// every flagged copy its place among them, and the tile's total moves the
// expert's next row on. The rows of an expert keep copy order (the stable
// counting sort the CPU runs), in n / kOrderBlock steps per block instead of
// n in one thread.
constexpr int kOrderBlock = 256;

__global__ void order_kernel(const int* expert, int64_t n, int k, int E, const int64_t* counts,
                             int64_t* row_of, int64_t* send_token) {
  using Scan = cub::BlockScan<int, kOrderBlock>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int64_t next;
  const int e = blockIdx.x;
  if (e == E) {  // the dropped copies
    for (int64_t i = threadIdx.x; i < n; i += kOrderBlock)
      if (expert[i] < 0) row_of[i] = -1;
    return;
  }
  if (threadIdx.x == 0) {
    int64_t first = 0;
    for (int g = 0; g < e; ++g) first += counts[g];
    next = first;
  }
  __syncthreads();
  for (int64_t start = 0; start < n; start += kOrderBlock) {
    const int64_t i = start + threadIdx.x;
    const int mine = i < n && expert[i] == e ? 1 : 0;
    int place = 0, total = 0;
    Scan(scan).ExclusiveSum(mine, place, total);
    if (mine) {
      row_of[i] = next + place;
      send_token[next + place] = i / k;
    }
    __syncthreads();  // every thread has read `next` and the scan's storage is free
    if (threadIdx.x == 0) next += total;
    __syncthreads();
  }
}

#undef GRID_STRIDE

unsigned warp_blocks(int64_t warps) {
  return unsigned((warps * 32 + plan::kThreads - 1) / plan::kThreads);
}

}  // namespace

void gather_rows(const Ctx& c, const float* x, int64_t d, const int64_t* src_row, int64_t n,
                 float* out) {
  if (n * d == 0) return;
  gather_kernel<<<plan::grid_for(n * d), plan::kThreads, 0, stream_of(c)>>>(x, d, src_row, n, out);
  CUDA_CHECK_LAUNCH();
}

void combine_rows(const Ctx& c, const RowSource& rows, int64_t d, const int64_t* row,
                  const float* weight, int64_t T, int k, float* y) {
  if (T * d == 0) return;
  combine_kernel<<<plan::grid_for(T * d), plan::kThreads, 0, stream_of(c)>>>(rows, d, row, weight,
                                                                             T, k, y);
  CUDA_CHECK_LAUNCH();
}

void combine_rows_backward(const Ctx& c, const RowSource& rows, const float* dy, int64_t d,
                           const int64_t* row, const float* weight, int64_t T, int k, float* drows,
                           float* dweight) {
  if (T * k == 0) return;
  combine_backward_kernel<<<warp_blocks(T * k), plan::kThreads, 0, stream_of(c)>>>(
      rows, dy, d, row, weight, T, k, drows, dweight);
  CUDA_CHECK_LAUNCH();
}

void scatter_add_rows(const Ctx& c, const float* drows, int64_t d, const int64_t* row, int64_t T,
                      int k, float* dx) {
  cuda::combine_rows(c, RowSource(drows), d, row, nullptr, T, k, dx);
}

void expert_counts(const Ctx& c, const int* expert, int64_t n, int E, int64_t* counts) {
  static_assert(sizeof(unsigned long long) == sizeof(int64_t), "counts are 64-bit");
  fill_zero(c, counts, size_t(E) * sizeof(int64_t));
  if (n == 0) return;
  counts_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(
      expert, n, E, reinterpret_cast<unsigned long long*>(counts));
  CUDA_CHECK_LAUNCH();
}

void expert_order(const Ctx& c, const int* expert, int64_t n, int k, int E, const int64_t* counts,
                  int64_t* row_of, int64_t* send_token) {
  if (n == 0) return;
  // one block per expert, and one for the dropped copies
  order_kernel<<<unsigned(E + 1), kOrderBlock, 0, stream_of(c)>>>(expert, n, k, E, counts, row_of,
                                                                  send_token);
  CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
