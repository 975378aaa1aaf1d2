// Flash attention on the GPU, forward and backward (the contract is
// kernels/attention.hpp), with fp32 or bf16 storage and fp32 arithmetic, on
// CUDA cores. The bf16 forward with head dim 64 or 128 runs on tensor cores
// instead (attention_tc.cu).
//
// All three kernels share one shape (plan.hpp): a block of kAttnWarps warps
// owns kAttnBlockRows rows of one operand, kAttnRowsPerWarp per warp, and
// sweeps tiles of 32 rows of the other operand staged in shared memory. For a
// dot product each lane takes one tile row (32 dot products at once); for an
// accumulation each lane takes the head-dimension columns lane, lane + 32, ...
// and the per-row weights travel by warp shuffle. The score matrix is never
// stored; the softmax is online in the forward and recomputed from the LSE
// in the backward, which is split in two kernels (dQ over query blocks, dK and
// dV over key blocks) so that every gradient element has one owner and no
// atomics are needed.
//
// Masking: a block sweeps only the keys any of its queries can see
// (attn_key_range: causal end, window start, the documents of its first and
// last query) and the dK/dV kernel only the queries that can see any of its
// keys (attn_query_range), so tiles outside cost nothing; within a tile the
// mask is per element (causal, window, document). GQA: query head h reads kv head h / (H / Hkv)
// through the row stride; the dK/dV kernel loops over the group's query heads.
#include <type_traits>

#include "attention_tc.cuh"
#include "common.cuh"

namespace trident::kernels::cuda {
namespace {

using plan::kAttnBlockRows;
using plan::kAttnRowsPerWarp;
using plan::kAttnThreads;
using plan::kAttnTile;

// Copies rows [r0, r0 + n) of a [rows, ld] operand (columns col0 .. col0+D)
// into shared memory with row stride `stride`, as fp32; rows past n are 0.
template <class T>
__device__ void stage_rows(float* dst, int stride, int tile_rows, const T* src, int64_t ld,
                           int64_t r0, int64_t n, int64_t col0, int D) {
  for (int e = threadIdx.x; e < tile_rows * D; e += blockDim.x) {
    const int r = e / D, d = e % D;
    dst[r * stride + d] = r < n ? load_f(src + (r0 + r) * ld + col0 + d) : 0.0f;
  }
}

__device__ __forceinline__ float dot_smem(const float* a, const float* b, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; ++d) s = fmaf(a[d], b[d], s);
  return s;
}

// acc[c] += sum over the tile's rows j < n of w_j * tile[j][lane + 32c], w_j
// being lane j's value of w.
template <int DC>
__device__ __forceinline__ void accumulate_rows(float (&acc)[DC], float w, const float* tile,
                                                int stride, int n, int D, int lane) {
  for (int j = 0; j < n; ++j) {
    const float wj = __shfl_sync(kFullMask, w, j);
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      if (d < D) acc[c] = fmaf(wj, tile[j * stride + d], acc[c]);
    }
  }
}

// The forward's per-row state of a warp: running maximum m, running sum l
// and the unnormalized output acc (columns lane, lane + 32, ...).
template <int DC>
struct ForwardRows {
  float m[kAttnRowsPerWarp], l[kAttnRowsPerWarp], acc[kAttnRowsPerWarp][DC];
};

// The rows' state at the start: empty, or (resume) the earlier output and
// its LSE as a maximum with sum 1.
template <class T, int DC>
__device__ __forceinline__ void forward_seed(const AttnShape& s, const T* out, const float* lse,
                                             bool resume, int64_t i0, int warp, int lane, int h,
                                             int64_t ldq, ForwardRows<DC>& st) {
  const int D = s.D;
#pragma unroll
  for (int r = 0; r < kAttnRowsPerWarp; ++r) {
    const int64_t i = i0 + warp * kAttnRowsPerWarp + r;
    const float seed = (resume && i < s.Tq) ? lse[i * s.H + h] : -INFINITY;
    st.m[r] = seed;
    st.l[r] = seed == -INFINITY ? 0.0f : 1.0f;
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      st.acc[r][c] = (st.l[r] > 0.0f && d < D) ? load_f(out + i * ldq + int64_t(h) * D + d) : 0.0f;
    }
  }
}

// One staged tile of keys (from j0, cols of them) folded into the warp's
// rows by the online softmax.
template <int DC>
__device__ __forceinline__ void forward_tile(const AttnShape& s, int64_t i0, int64_t j0, int cols,
                                             int warp, int lane, const float* qs, const float* ks,
                                             const float* vs, ForwardRows<DC>& st) {
  const int D = s.D;
#pragma unroll
  for (int r = 0; r < kAttnRowsPerWarp; ++r) {
    const int row = warp * kAttnRowsPerWarp + r;
    const int64_t i = i0 + row;
    if (i >= s.Tq) break;  // warp-uniform
    float sc = -INFINITY;
    if (lane < cols && plan::attn_visible(s, i, j0 + lane))
      sc = s.scale * dot_smem(qs + row * D, ks + lane * (D + 1), D);
    const float m_new = fmaxf(st.m[r], warp_max(sc));
    if (m_new == -INFINITY) continue;  // nothing visible to this row yet
    const float p = sc == -INFINITY ? 0.0f : expf(sc - m_new);
    const float alpha = expf(st.m[r] - m_new);
    st.l[r] = st.l[r] * alpha + warp_sum(p);
    st.m[r] = m_new;
    for (int c = 0; c < DC; ++c) st.acc[r][c] *= alpha;
    accumulate_rows(st.acc[r], p, vs, D, cols, D, lane);
  }
}

// The rows' output (acc / l) and LSE stored.
template <class T, int DC>
__device__ __forceinline__ void forward_finish(const AttnShape& s, T* out, float* lse, int64_t i0,
                                               int warp, int lane, int h, int64_t ldq,
                                               const ForwardRows<DC>& st) {
  const int D = s.D;
#pragma unroll
  for (int r = 0; r < kAttnRowsPerWarp; ++r) {
    const int64_t i = i0 + warp * kAttnRowsPerWarp + r;
    if (i >= s.Tq) break;
    const bool seen = st.l[r] > 0.0f;  // a fully masked row: output 0, LSE -inf
    const float inv = seen ? 1.0f / st.l[r] : 0.0f;
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      if (d < D) store_f(out + i * ldq + int64_t(h) * D + d, seen ? st.acc[r][c] * inv : 0.0f);
    }
    if (lane == 0) lse[i * s.H + h] = seen ? st.m[r] + logf(st.l[r]) : -INFINITY;
  }
}

// Forward (and its resume): grid (query blocks, H). The loops over a warp's
// rows are unrolled so that the per-row state stays in registers.
template <class T, int DC>
__global__ void __launch_bounds__(kAttnThreads)
    attn_forward_kernel(AttnShape s, const T* q, const T* k, const T* v, T* out, float* lse,
                        bool resume) {
  extern __shared__ float smem[];
  const int D = s.D, h = blockIdx.y, g = h / (s.H / s.Hkv);
  const int64_t ldq = int64_t(s.H) * D, ldkv = int64_t(s.Hkv) * D;
  const int64_t i0 = int64_t(blockIdx.x) * kAttnBlockRows;
  const int64_t rows = min(int64_t(kAttnBlockRows), s.Tq - i0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* qs = smem;                      // [block rows][D]
  float* ks = qs + kAttnBlockRows * D;   // [tile][D + 1]
  float* vs = ks + kAttnTile * (D + 1);  // [tile][D]
  stage_rows(qs, D, kAttnBlockRows, q, ldq, i0, rows, int64_t(h) * D, D);

  ForwardRows<DC> st;
  forward_seed<T, DC>(s, out, lse, resume, i0, warp, lane, h, ldq, st);

  int64_t kbegin, kend;
  attn_key_range(s, i0, rows, &kbegin, &kend);
  for (int64_t j0 = kbegin; j0 < kend; j0 += kAttnTile) {
    const int cols = int(min(int64_t(kAttnTile), kend - j0));
    __syncthreads();  // the previous tile is no longer read
    stage_rows(ks, D + 1, kAttnTile, k, ldkv, j0, cols, int64_t(g) * D, D);
    stage_rows(vs, D, kAttnTile, v, ldkv, j0, cols, int64_t(g) * D, D);
    __syncthreads();
    forward_tile<DC>(s, i0, j0, cols, warp, lane, qs, ks, vs, st);
  }

  forward_finish<T, DC>(s, out, lse, i0, warp, lane, h, ldq, st);
}

// delta[i, h] = sum_d dO[i,h,d] * O[i,h,d]: one warp per (row, head).
template <class T>
__global__ void attn_delta_kernel(AttnShape s, const T* out, const T* dout, float* delta) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= s.Tq * s.H) return;  // whole warps leave together
  const T* o = out + w * s.D;   // [Tq, H, D] rows are consecutive per (i, h)
  const T* g = dout + w * s.D;
  float acc = 0.0f;
  for (int d = lane; d < s.D; d += 32) acc = fmaf(load_f(g + d), load_f(o + d), acc);
  acc = warp_sum(acc);
  if (lane == 0) delta[w] = acc;
}

// The probability of (i, j) recomputed from the row's LSE and its softmax
// gradient dS = P * (dP - delta); 0 where masked or the row saw nothing.
struct ProbGrad {
  float p, ds;
};
__device__ __forceinline__ ProbGrad prob_grad(const AttnShape& s, bool ok, const float* qrow,
                                              const float* krow, const float* dorow,
                                              const float* vrow, float row_lse, float delta,
                                              int D) {
  if (!ok || row_lse == -INFINITY) return {0.0f, 0.0f};
  const float p = expf(s.scale * dot_smem(qrow, krow, D) - row_lse);
  const float dp = dot_smem(dorow, vrow, D);
  return {p, p * (dp - delta)};
}

// dQ += scale * dS K: grid (query blocks, H).
template <class T, int DC>
__global__ void __launch_bounds__(kAttnThreads)
    attn_backward_dq_kernel(AttnShape s, const T* q, const T* k, const T* v, const float* lse,
                            const float* delta, const T* dout, float* dq) {
  extern __shared__ float smem[];
  const int D = s.D, h = blockIdx.y, g = h / (s.H / s.Hkv);
  const int64_t ldq = int64_t(s.H) * D, ldkv = int64_t(s.Hkv) * D;
  const int64_t i0 = int64_t(blockIdx.x) * kAttnBlockRows;
  const int64_t rows = min(int64_t(kAttnBlockRows), s.Tq - i0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* qs = smem;
  float* dos = qs + kAttnBlockRows * D;
  float* ks = dos + kAttnBlockRows * D;  // [tile][D + 1]
  float* vs = ks + kAttnTile * (D + 1);  // [tile][D + 1]
  stage_rows(qs, D, kAttnBlockRows, q, ldq, i0, rows, int64_t(h) * D, D);
  stage_rows(dos, D, kAttnBlockRows, dout, ldq, i0, rows, int64_t(h) * D, D);

  float acc[kAttnRowsPerWarp][DC] = {};
  float row_lse[kAttnRowsPerWarp], row_delta[kAttnRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kAttnRowsPerWarp; ++r) {
    const int64_t i = i0 + warp * kAttnRowsPerWarp + r;
    row_lse[r] = i < s.Tq ? lse[i * s.H + h] : -INFINITY;
    row_delta[r] = i < s.Tq ? delta[i * s.H + h] : 0.0f;
  }

  int64_t kbegin, kend;
  attn_key_range(s, i0, rows, &kbegin, &kend);
  for (int64_t j0 = kbegin; j0 < kend; j0 += kAttnTile) {
    const int cols = int(min(int64_t(kAttnTile), kend - j0));
    __syncthreads();
    stage_rows(ks, D + 1, kAttnTile, k, ldkv, j0, cols, int64_t(g) * D, D);
    stage_rows(vs, D + 1, kAttnTile, v, ldkv, j0, cols, int64_t(g) * D, D);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kAttnRowsPerWarp; ++r) {
      const int row = warp * kAttnRowsPerWarp + r;
      const int64_t i = i0 + row;
      if (i >= s.Tq || row_lse[r] == -INFINITY) continue;  // warp-uniform
      const bool ok = lane < cols && plan::attn_visible(s, i, j0 + lane);
      const ProbGrad pg = prob_grad(s, ok, qs + row * D, ks + lane * (D + 1), dos + row * D,
                                    vs + lane * (D + 1), row_lse[r], row_delta[r], D);
      accumulate_rows(acc[r], pg.ds, ks, D + 1, cols, D, lane);
    }
  }

#pragma unroll
  for (int r = 0; r < kAttnRowsPerWarp; ++r) {
    const int64_t i = i0 + warp * kAttnRowsPerWarp + r;
    if (i >= s.Tq) break;
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      if (d < D) dq[i * ldq + int64_t(h) * D + d] += s.scale * acc[r][c];
    }
  }
}

// dV += P^T dO and dK += scale * dS^T Q: grid (key blocks, Hkv); the block
// sums over the query heads of its kv head, so GQA needs no atomics.
template <class T, int DC>
__global__ void __launch_bounds__(kAttnThreads)
    attn_backward_dkv_kernel(AttnShape s, const T* q, const T* k, const T* v, const float* lse,
                             const float* delta, const T* dout, float* dk, float* dv) {
  extern __shared__ float smem[];
  const int D = s.D, g = blockIdx.y, group = s.H / s.Hkv;
  const int64_t ldq = int64_t(s.H) * D, ldkv = int64_t(s.Hkv) * D;
  const int64_t j0 = int64_t(blockIdx.x) * kAttnBlockRows;
  const int64_t keys = min(int64_t(kAttnBlockRows), s.Tk - j0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* ks = smem;                         // [block rows][D]
  float* vs = ks + kAttnBlockRows * D;      // [block rows][D]
  float* qt = vs + kAttnBlockRows * D;      // [tile][D + 1]
  float* dot = qt + kAttnTile * (D + 1);    // [tile][D + 1]
  float* lset = dot + kAttnTile * (D + 1);  // [tile]
  float* dlt = lset + kAttnTile;            // [tile]
  stage_rows(ks, D, kAttnBlockRows, k, ldkv, j0, keys, int64_t(g) * D, D);
  stage_rows(vs, D, kAttnBlockRows, v, ldkv, j0, keys, int64_t(g) * D, D);

  float dk_acc[kAttnRowsPerWarp][DC] = {}, dv_acc[kAttnRowsPerWarp][DC] = {};
  int64_t ibegin, iend;
  attn_query_range(s, j0, keys, &ibegin, &iend);
  for (int h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i0 = ibegin; i0 < iend; i0 += kAttnTile) {
      const int n = int(min(int64_t(kAttnTile), iend - i0));
      __syncthreads();
      stage_rows(qt, D + 1, kAttnTile, q, ldq, i0, n, int64_t(h) * D, D);
      stage_rows(dot, D + 1, kAttnTile, dout, ldq, i0, n, int64_t(h) * D, D);
      if (threadIdx.x < kAttnTile) {
        const int t = threadIdx.x;
        lset[t] = t < n ? lse[(i0 + t) * s.H + h] : -INFINITY;
        dlt[t] = t < n ? delta[(i0 + t) * s.H + h] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kAttnRowsPerWarp; ++r) {
        const int row = warp * kAttnRowsPerWarp + r;
        const int64_t j = j0 + row;
        if (j >= s.Tk) break;  // warp-uniform
        const bool ok = lane < n && plan::attn_visible(s, i0 + lane, j);
        const ProbGrad pg = prob_grad(s, ok, qt + lane * (D + 1), ks + row * D,
                                      dot + lane * (D + 1), vs + row * D, lset[lane], dlt[lane], D);
        accumulate_rows(dv_acc[r], pg.p, dot, D + 1, n, D, lane);
        accumulate_rows(dk_acc[r], pg.ds, qt, D + 1, n, D, lane);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kAttnRowsPerWarp; ++r) {
    const int64_t j = j0 + warp * kAttnRowsPerWarp + r;
    if (j >= s.Tk) break;
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      if (d >= D) continue;
      dk[j * ldkv + int64_t(g) * D + d] += s.scale * dk_acc[r][c];
      dv[j * ldkv + int64_t(g) * D + d] += dv_acc[r][c];
    }
  }
}

// One warp per row; the same formulas as the CPU merge.
__global__ void merge_kernel(int64_t n_rows, int D, float* out, float* lse, const float* out_b,
                             const float* lse_b) {
  const int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= n_rows) return;
  const float a = lse[r], b = lse_b[r];
  if (b == -INFINITY) return;
  float* o = out + r * D;
  const float* ob = out_b + r * D;
  const bool first = a == -INFINITY;
  const float w = first ? 1.0f : 1.0f / (1.0f + expf(a - b));
  for (int d = lane; d < D; d += 32) o[d] = first ? ob[d] : o[d] - w * (o[d] - ob[d]);
  __syncwarp();
  if (lane == 0) lse[r] = first ? b : fmaxf(a, b) + log1pf(expf(-fabsf(a - b)));
}

// Launches `kernel` with the dynamic shared memory of `kind`, raising the
// per-kernel limit first where it exceeds the default 48 KiB.
template <class Kernel, class... Args>
void launch_attn(const Ctx& c, Kernel kernel, plan::AttnKernel kind, dim3 grid, int D,
                 Args... args) {
  const size_t smem = plan::attn_smem_bytes(kind, D);
  if (smem > 48 * 1024)
    CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<grid, plan::kAttnThreads, smem, stream_of(c)>>>(args...);
  CUDA_CHECK_LAUNCH();
}

template <class T, int DC>
void forward_for(const Ctx& c, const AttnShape& s, const T* q, const T* k, const T* v, T* out,
                 float* lse, bool resume) {
  const dim3 grid(unsigned(plan::attn_row_blocks(s.Tq)), unsigned(s.H));
  launch_attn(c, attn_forward_kernel<T, DC>, plan::AttnKernel::forward, grid, s.D, s, q, k, v, out,
              lse, resume);
}

template <class T, int DC>
void backward_for(const Ctx& c, const AttnShape& s, const T* q, const T* k, const T* v,
                  const T* out, const float* lse, const T* dout, float* dq, float* dk, float* dv) {
  Scratch delta(c, plan::attn_workspace_bytes(s, true));
  const int64_t warps = s.Tq * s.H;
  const unsigned blocks = unsigned((warps * 32 + plan::kThreads - 1) / plan::kThreads);
  attn_delta_kernel<T>
      <<<blocks, plan::kThreads, 0, stream_of(c)>>>(s, out, dout, delta.as<float>());
  CUDA_CHECK_LAUNCH();
  const dim3 qgrid(unsigned(plan::attn_row_blocks(s.Tq)), unsigned(s.H));
  launch_attn(c, attn_backward_dq_kernel<T, DC>, plan::AttnKernel::backward_dq, qgrid, s.D, s, q, k,
              v, lse, static_cast<const float*>(delta.as<float>()), dout, dq);
  if (s.Tk == 0) return;
  const dim3 kgrid(unsigned(plan::attn_row_blocks(s.Tk)), unsigned(s.Hkv));
  launch_attn(c, attn_backward_dkv_kernel<T, DC>, plan::AttnKernel::backward_dkv, kgrid, s.D, s, q,
              k, v, lse, static_cast<const float*>(delta.as<float>()), dout, dk, dv);
}

// Calls fn.template operator()<DC>() with DC = the lane chunks of head_dim.
template <class Fn>
void with_head_dim(int D, Fn&& fn) {
  switch (plan::attn_lane_chunks(D)) {
    case 1:
      return fn.template operator()<1>();
    case 2:
      return fn.template operator()<2>();
    case 4:
      return fn.template operator()<4>();
    case 8:
      return fn.template operator()<8>();
    default:
      throw Error("attention (CUDA): head_dim " + std::to_string(D) + " not supported (1.." +
                  std::to_string(plan::kAttnMaxHeadDim) + ")");
  }
}

template <class T>
void forward(const Ctx& c, const AttnShape& s, const T* q, const T* k, const T* v, T* out,
             float* lse, bool resume) {
  check_attn_shape(s);
  if (s.Tq == 0) return;
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    if (attention_forward_tc(c, s, q, k, v, out, lse, resume)) return;
  with_head_dim(s.D, [&]<int DC>() { forward_for<T, DC>(c, s, q, k, v, out, lse, resume); });
}

template <class T>
void backward(const Ctx& c, const AttnShape& s, const T* q, const T* k, const T* v, const T* out,
              const float* lse, const T* dout, float* dq, float* dk, float* dv) {
  check_attn_shape(s);
  if (s.Tq == 0) return;
  with_head_dim(s.D,
                [&]<int DC>() { backward_for<T, DC>(c, s, q, k, v, out, lse, dout, dq, dk, dv); });
}

}  // namespace

void attention_forward(const Ctx& c, const AttnShape& s, const float* q, const float* k,
                       const float* v, float* out, float* lse) {
  forward(c, s, q, k, v, out, lse, false);
}

void attention_forward_resume(const Ctx& c, const AttnShape& s, const float* q, const float* k,
                              const float* v, float* out, float* lse) {
  forward(c, s, q, k, v, out, lse, true);
}

void attention_backward(const Ctx& c, const AttnShape& s, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv) {
  backward(c, s, q, k, v, out, lse, dout, dq, dk, dv);
}

void attention_forward_bf16(const Ctx& c, const AttnShape& s, const Bf16* q, const Bf16* k,
                            const Bf16* v, Bf16* out, float* lse) {
  forward(c, s, dev(q), dev(k), dev(v), dev(out), lse, false);
}

void attention_forward_resume_bf16(const Ctx& c, const AttnShape& s, const Bf16* q, const Bf16* k,
                                   const Bf16* v, Bf16* out, float* lse) {
  forward(c, s, dev(q), dev(k), dev(v), dev(out), lse, true);
}

void attention_backward_bf16(const Ctx& c, const AttnShape& s, const Bf16* q, const Bf16* k,
                             const Bf16* v, const Bf16* out, const float* lse, const Bf16* dout,
                             float* dq, float* dk, float* dv) {
  backward(c, s, dev(q), dev(k), dev(v), dev(out), lse, dev(dout), dq, dk, dv);
}

void merge_partial_attention(const Ctx& c, int64_t n_rows, int D, float* out, float* lse,
                             const float* out_b, const float* lse_b) {
  if (n_rows == 0) return;
  const unsigned blocks = unsigned((n_rows * 32 + plan::kThreads - 1) / plan::kThreads);
  merge_kernel<<<blocks, plan::kThreads, 0, stream_of(c)>>>(n_rows, D, out, lse, out_b, lse_b);
  CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
