// Launch plans of the CUDA kernels: tile shapes, grids, shared-memory and
// workspace sizes, and the causal ranges that let a block skip tiles. Plain
// C++ (host and device), so the CPU unit tests check the arithmetic that the
// GPU kernels rely on (tests/unit/kernels/test_cuda_plan.cpp).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "trident/kernels/attention.hpp"
#include "trident/kernels/host_device.hpp"

namespace trident::kernels::cuda::plan {

inline constexpr int kWarp = 32;

// Flash attention tiling. A block has kAttnWarps warps; each warp owns
// kAttnRowsPerWarp rows of the block's own operand (query rows in the
// forward and dQ kernels, key rows in the dK/dV kernel) and sweeps tiles of
// kWarp rows of the other operand, one row per lane.
inline constexpr int kAttnWarps = 4;
inline constexpr int kAttnRowsPerWarp = 4;
inline constexpr int kAttnBlockRows = kAttnWarps * kAttnRowsPerWarp;
inline constexpr int kAttnTile = kWarp;
inline constexpr int kAttnThreads = kAttnWarps * kWarp;
inline constexpr int kAttnMaxHeadDim = 256;

// Accumulator registers per lane and row: head_dim rounded up to the next of
// 32, 64, 128, 256, divided over the warp's lanes; 0 if D is not supported.
constexpr int attn_lane_chunks(int D) {
  if (D <= 0 || D > kAttnMaxHeadDim) return 0;
  int dmax = kWarp;
  while (dmax < D) dmax *= 2;
  return dmax / kWarp;
}

// Shared memory of one block in bytes. Tiles that a lane reads row-wise (its
// own row, across d) are padded to D + 1 floats so the 32 lanes hit 32
// different banks.
enum class AttnKernel { forward, backward_dq, backward_dkv };
constexpr size_t attn_smem_bytes(AttnKernel k, int D) {
  const size_t own = size_t(kAttnBlockRows) * D, padded = size_t(kAttnTile) * (D + 1);
  switch (k) {
    case AttnKernel::forward:
      return 4 * (own + padded + size_t(kAttnTile) * D);
    case AttnKernel::backward_dq:
      return 4 * (2 * own + 2 * padded);
    case AttnKernel::backward_dkv:
      return 4 * (2 * own + 2 * padded + 2 * size_t(kAttnTile));
  }
  return 0;
}

// Blocks along the first grid dimension: query blocks for the forward and dQ,
// key blocks for dK/dV (the second dimension is the head, resp. kv head).
constexpr int64_t attn_row_blocks(int64_t rows) {
  return (rows + kAttnBlockRows - 1) / kAttnBlockRows;
}

// Keys [0, end) that any of the queries [i0, i0 + rows) may see: with the
// causal mask the later keys are in every one of these queries' future.
TRIDENT_HD constexpr int64_t attn_key_end(const AttnShape& s, int64_t i0, int64_t rows) {
  if (!s.causal) return s.Tk;
  const int64_t last_q = s.q_pos0 + i0 + rows - 1;
  const int64_t end = last_q - s.k_pos0 + 1;
  return end < 0 ? 0 : (end > s.Tk ? s.Tk : end);
}

// First query that sees key j0 (queries before it are all in its past).
TRIDENT_HD constexpr int64_t attn_query_begin(const AttnShape& s, int64_t j0) {
  if (!s.causal) return 0;
  const int64_t b = s.k_pos0 + j0 - s.q_pos0;
  return b < 0 ? 0 : (b > s.Tq ? s.Tq : b);
}

// The element mask (attention.hpp's rule; document ids read from the shape's
// device arrays). The key and query ranges of a block with documents or a
// window come from attn_key_range / attn_query_range (attention.hpp); the two
// functions above are their causal-only special case.
TRIDENT_HD inline bool attn_visible(const AttnShape& s, int64_t i, int64_t j) {
  return attn_pair_visible(s, s.q_pos0 + i, s.k_pos0 + j, s.documents() ? s.q_doc[i] : 0,
                           s.documents() ? s.k_doc[j] : 0);
}

// Device scratch of one call: the backward keeps delta = rowsum(dO * O), one
// float per query row and head.
constexpr size_t attn_workspace_bytes(const AttnShape& s, bool backward) {
  return backward ? size_t(s.Tq) * size_t(s.H) * sizeof(float) : 0;
}

// The bf16 tensor-core forward (attention_tc.cu): a block of kTcWarps warps
// owns kTcRows query rows (16 per warp, one WMMA row block) and sweeps key
// tiles of kTcTile rows. Shared memory holds the Q, K and V tiles in bf16 and,
// per warp, its score block (fp32), probabilities (bf16) and output
// accumulator (fp32, [16][D]).
inline constexpr int kTcWarps = 4;
inline constexpr int kTcRows = 16 * kTcWarps;
inline constexpr int kTcTile = 64;
inline constexpr int kTcThreads = kTcWarps * kWarp;
constexpr bool attn_tc_supported(int D) { return D == 64 || D == 128; }
constexpr size_t attn_tc_smem_bytes(int D) {
  const size_t tiles = 2 * (size_t(kTcRows) * D + 2 * size_t(kTcTile) * D);  // Q, K, V bf16
  const size_t per_warp = 4 * 16 * size_t(kTcTile) + 2 * 16 * size_t(kTcTile) + 4 * 16 * size_t(D);
  return tiles + kTcWarps * per_warp;
}

// Elementwise kernels: a grid-stride loop over n items; blocks capped so a
// huge n does not ask for more than the hardware schedules at once.
inline constexpr int kThreads = 256;
inline constexpr int64_t kMaxBlocks = 65535;
constexpr unsigned grid_for(int64_t n, int threads = kThreads) {
  if (n <= 0) return 1;
  return unsigned(std::min<int64_t>((n + threads - 1) / threads, kMaxBlocks));
}

// The RMSNorm weight gradient's row chunks (ops.cu): a partial sum per
// chunk of about 64 rows, at most 256 chunks. Fixed by T alone, so the
// summation order, hence the bits, is the same on every device and run.
constexpr int64_t rmsnorm_dw_chunks(int64_t T) {
  return std::clamp<int64_t>((T + 63) / 64, 1, 256);
}
constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Row kernels (one block per row, the row's columns over the threads): the
// threads of a block, a multiple of the warp up to kThreads, for rows of n.
constexpr int row_threads(int64_t n) {
  int t = kWarp;
  while (t < kThreads && t < n) t *= 2;
  return t;
}

// The row-major GEMM C[M,N] = op(A)[M,K] op(B)[K,N] as cuBLAS's column-major
// call: a row-major matrix is its transpose in column-major, so cuBLAS
// computes C^T = op(B)^T op(A)^T: B is its first operand, A its second, and
// M and N trade places.
struct ColumnMajorGemm {
  bool trans_first, trans_second;  // op of B, op of A
  int64_t m, n, k;
};
constexpr ColumnMajorGemm column_major(bool trans_a, bool trans_b, int64_t M, int64_t N,
                                       int64_t K) {
  return {trans_b, trans_a, N, M, K};
}

// cuBLAS takes 32-bit sizes and leading dimensions.
constexpr bool fits_int32(int64_t v) { return v >= 0 && v <= INT32_MAX; }

}  // namespace trident::kernels::cuda::plan
