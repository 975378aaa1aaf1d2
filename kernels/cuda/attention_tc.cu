// Flash attention forward on tensor cores for bf16 (WMMA 16x16x16, fp32
// accumulation), head dims 64 and 128: the same contract and the same online
// softmax as the CUDA-core kernel in attention.cu, which covers every other
// case and the backward.
//
// A block of 4 warps owns 64 query rows of one head, 16 per warp (one WMMA
// row block), and sweeps key tiles of 64 rows staged in shared memory as bf16.
// Per tile a warp computes its 16 x 64 scores S = Q Kᵀ with WMMA into shared
// memory, runs the online softmax on them (two lanes per row, 32 columns
// each), writes P as bf16, rescales its output accumulator (kept in shared
// memory, fp32, because a WMMA fragment's element layout is opaque) and adds
// P V with WMMA. Causal tile skipping and the element mask are the ones of
// plan.hpp; masked and padded columns get probability 0.
#include <mma.h>

#include <cstdint>

#include "attention_tc.cuh"
#include "common.cuh"

namespace trident::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
using plan::kTcRows;
using plan::kTcThreads;
using plan::kTcTile;
using plan::kTcWarps;

// Rows [r0, r0 + n) of a bf16 operand (row stride ld, columns col0 .. col0
// + D) into shared memory [tile_rows][D], two elements per 32-bit word; rows
// past n are zero. Callers guarantee 4-byte alignment (even D, ld and col0,
// aligned base pointers).
__device__ void stage_bf16(bf16* dst, int tile_rows, const bf16* src, int64_t ld, int64_t r0,
                           int64_t n, int64_t col0, int D) {
  const int words = D / 2;
  auto* d32 = reinterpret_cast<uint32_t*>(dst);
  for (int e = threadIdx.x; e < tile_rows * words; e += blockDim.x) {
    const int r = e / words, w = e % words;
    d32[e] = r < n ? *reinterpret_cast<const uint32_t*>(src + (r0 + r) * ld + col0 + 2 * w) : 0u;
  }
}

// S[16][kTcTile] = Q_w[16][D] Kᵀ for one warp.
template <int D>
__device__ void scores_tc(const bf16* qw, const bf16* ks, float* sw) {
#pragma unroll
  for (int n = 0; n < kTcTile / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;  // Kᵀ
      wmma::load_matrix_sync(a, qw + kk * 16, D);
      wmma::load_matrix_sync(b, ks + n * 16 * D + kk * 16, D);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(sw + n * 16, acc, kTcTile, wmma::mem_row_major);
  }
}

// O_w[16][D] += P_w[16][kTcTile] V for one warp.
template <int D>
__device__ void accumulate_pv_tc(const bf16* pw, const bf16* vs, float* ow) {
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, ow + n * 16, D, wmma::mem_row_major);
#pragma unroll
    for (int kk = 0; kk < kTcTile / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
      wmma::load_matrix_sync(a, pw + kk * 16, kTcTile);
      wmma::load_matrix_sync(b, vs + kk * 16 * D + n * 16, D);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(ow + n * 16, acc, D, wmma::mem_row_major);
  }
}

// The running softmax state of one query row, held by its two lanes.
struct RowState {
  float m, l;
};

// One tile's online-softmax step for this lane's half row: P into prow,
// the row's state updated, the output row half rescaled. Each lane starts
// its sweep at its own column (c + lane), so the 32 lanes, whose rows all
// begin in the same bank, read and write 32 different banks.
__device__ void softmax_step(const AttnShape& s, int64_t i, int64_t j0, int cols, int half,
                             int lane, const float* srow, bf16* prow, float* orow_half, int half_d,
                             RowState& st) {
  constexpr unsigned kFull = 0xffffffffu;
  float mx = -INFINITY;
  for (int c = 0; c < 32; ++c) {
    const int j = half * 32 + (c + lane) % 32;
    if (i < s.Tq && j < cols && plan::attn_visible(s, i, j0 + j)) mx = fmaxf(mx, s.scale * srow[j]);
  }
  mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
  const float m_new = fmaxf(st.m, mx);
  float psum = 0.0f, alpha = 1.0f;
  if (m_new != -INFINITY) alpha = expf(st.m - m_new);
  for (int c = 0; c < 32; ++c) {
    const int j = half * 32 + (c + lane) % 32;
    float p = 0.0f;
    if (m_new != -INFINITY && i < s.Tq && j < cols && plan::attn_visible(s, i, j0 + j))
      p = expf(s.scale * srow[j] - m_new);
    prow[j] = __float2bfloat16(p);
    psum += p;
  }
  psum += __shfl_xor_sync(kFull, psum, 1);
  if (m_new == -INFINITY) return;  // nothing visible to this row yet
  st.l = st.l * alpha + psum;
  st.m = m_new;
  if (alpha != 1.0f)
    for (int d = 0; d < half_d; ++d) orow_half[(d + lane) % half_d] *= alpha;
}

template <int D>
__global__ void __launch_bounds__(kTcThreads)
    attn_forward_tc_kernel(AttnShape s, const bf16* q, const bf16* k, const bf16* v, bf16* out,
                           float* lse, bool resume) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);  // [kTcRows][D]
  bf16* ks = qs + kTcRows * D;                   // [kTcTile][D]
  bf16* vs = ks + kTcTile * D;                   // [kTcTile][D]
  float* s_all = reinterpret_cast<float*>(vs + kTcTile * D);
  bf16* p_all = reinterpret_cast<bf16*>(s_all + kTcWarps * 16 * kTcTile);
  float* o_all = reinterpret_cast<float*>(p_all + kTcWarps * 16 * kTcTile);

  const int h = blockIdx.y, g = h / (s.H / s.Hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = lane / 2, half = lane % 2, half_d = D / 2;
  const int64_t ldq = int64_t(s.H) * D, ldkv = int64_t(s.Hkv) * D;
  const int64_t i0 = int64_t(blockIdx.x) * kTcRows;
  const int64_t rows = min(int64_t(kTcRows), s.Tq - i0);
  const int64_t i = i0 + warp * 16 + row;
  float* sw = s_all + warp * 16 * kTcTile;
  bf16* pw = p_all + warp * 16 * kTcTile;
  float* ow = o_all + warp * 16 * D;
  float* orow_half = ow + row * D + half * half_d;
  stage_bf16(qs, kTcRows, q, ldq, i0, rows, int64_t(h) * D, D);

  RowState st{-INFINITY, 0.0f};
  if (resume && i < s.Tq) {
    st.m = lse[i * s.H + h];
    st.l = st.m == -INFINITY ? 0.0f : 1.0f;
  }
  const bf16* orow_in = out + i * ldq + int64_t(h) * D + half * half_d;
  for (int d = 0; d < half_d; ++d) orow_half[d] = st.l > 0.0f ? __bfloat162float(orow_in[d]) : 0.0f;

  int64_t kbegin, kend;
  attn_key_range(s, i0, rows, &kbegin, &kend);
  for (int64_t j0 = kbegin; j0 < kend; j0 += kTcTile) {
    const int cols = int(min(int64_t(kTcTile), kend - j0));
    __syncthreads();  // the previous tile is no longer read
    stage_bf16(ks, kTcTile, k, ldkv, j0, cols, int64_t(g) * D, D);
    stage_bf16(vs, kTcTile, v, ldkv, j0, cols, int64_t(g) * D, D);
    __syncthreads();
    scores_tc<D>(qs + warp * 16 * D, ks, sw);
    __syncwarp();
    softmax_step(s, i, j0, cols, half, lane, sw + row * kTcTile, pw + row * kTcTile, orow_half,
                 half_d, st);
    __syncwarp();
    accumulate_pv_tc<D>(pw, vs, ow);
    __syncwarp();
  }

  if (i >= s.Tq) return;
  const bool seen = st.l > 0.0f;  // a fully masked row: output 0, LSE -inf
  const float inv = seen ? 1.0f / st.l : 0.0f;
  bf16* orow_out = out + i * ldq + int64_t(h) * D + half * half_d;
  for (int d = 0; d < half_d; ++d) orow_out[d] = __float2bfloat16(seen ? orow_half[d] * inv : 0.0f);
  if (half == 0) lse[i * s.H + h] = seen ? st.m + logf(st.l) : -INFINITY;
}

bool aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

template <int D>
void launch_tc(const Ctx& c, const AttnShape& s, const bf16* q, const bf16* k, const bf16* v,
               bf16* out, float* lse, bool resume) {
  const size_t smem = plan::attn_tc_smem_bytes(D);
  CUDA_CHECK(cudaFuncSetAttribute(attn_forward_tc_kernel<D>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const dim3 grid(unsigned((s.Tq + kTcRows - 1) / kTcRows), unsigned(s.H));
  attn_forward_tc_kernel<D><<<grid, kTcThreads, smem, stream_of(c)>>>(s, q, k, v, out, lse, resume);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attention_forward_tc(const Ctx& c, const AttnShape& s, const bf16* q, const bf16* k,
                          const bf16* v, bf16* out, float* lse, bool resume) {
  if (!plan::attn_tc_supported(s.D) || !aligned4(q) || !aligned4(k) || !aligned4(v) ||
      !aligned4(out))
    return false;
  if (s.D == 64)
    launch_tc<64>(c, s, q, k, v, out, lse, resume);
  else
    launch_tc<128>(c, s, q, k, v, out, lse, resume);
  return true;
}

}  // namespace trident::kernels::cuda
