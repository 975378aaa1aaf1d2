// gemm_direct (see gemm_direct.hpp): an AVX-512 register tile of 8 rows by
// 32 columns of C, A read by broadcast where it lies, B by vector loads of
// its rows; sgemm where the machine lacks AVX-512F or FMA.
#include "gemm_direct.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "host_params.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/backends.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define TRIDENT_GEMM_AVX512 1
#include <immintrin.h>
#endif

namespace trident::kernels::cpu {
namespace {

#ifdef TRIDENT_GEMM_AVX512
#define TRIDENT_AVX512 __attribute__((target("avx512f,fma")))

constexpr int kMR = 8;  // rows of the register tile
constexpr int kNV = 2;  // 16-float vectors across its columns
constexpr int64_t kNR = 16 * kNV;
// How many rows of B ahead of the one in use the tile prefetches (below),
// gemm_direct's row block, gemm_direct_nt's largest K (its panel holds K x
// kNR floats) and its rows per share of the next block's prefetch: the host
// parameters (host_params.hpp, read once per process from the caches).

// GCC 12's AVX-512 intrinsics (shuffles, min, max, scalef) start from an
// "undefined" register that -W(maybe-)uninitialized reports when they are
// inlined; every lane of their results is defined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// exp(x) as attention.cpp's exp8 computes it, lane for lane and rounding for
// rounding (the same fused multiply-adds where its AVX2 build contracts):
// x = n ln2 + r, e^r by the degree-7 Taylor polynomial, times 2^n (vscalefps
// multiplies by 2^n exactly, as exp8's exponent bits do); 0 below -87.
TRIDENT_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f), hi = _mm512_set1_ps(88.0f);
  const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  // max and min return their second operand when one is NaN: NaN stays NaN
  const __m512 xc = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 n =
      _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), magic), magic);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), xc);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 5040.0f), r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(__mmask16(~under), _mm512_scalef_ps(p, n));
}

TRIDENT_AVX512 float row_max_avx512(const float* x, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 m = ninf;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 in = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1u);
    const __m512 v = _mm512_mask_loadu_ps(ninf, in, x + j);
    // v > m ? v : m, as attention's pass: a NaN never replaces the maximum
    m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(v, m, _CMP_GT_OQ), v);
  }
  alignas(64) float t[16];
  _mm512_store_ps(t, m);
  float r = t[0];
  for (int u = 1; u < 16; ++u) r = std::max(r, t[u]);
  return r;
}

// The sum kept in two 16-lane accumulators, alternate blocks of 16 to each,
// added lane-wise and then across the lanes at the end: one addition per 16
// exponentials in each of two independent chains, where a single chain of
// two additions per block held the loop to the adder's latency. (Another
// order than attention.cpp's eight-float pass: the sums differ in their
// last bits.)
TRIDENT_AVX512 float exp_shift_sum_avx512(float* x, int64_t n, float m) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
#pragma GCC unroll 2
    for (int u = 0; u < 2; ++u) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + j + 16 * u), mv));
      _mm512_storeu_ps(x + j + 16 * u, e);
      sum[u] = _mm512_add_ps(sum[u], e);
    }
  }
  for (int u = 0; j < n; j += 16, ++u) {
    const __mmask16 in = n - j >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - j)) - 1u);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_mask_loadu_ps(ninf, in, x + j), mv));
    _mm512_mask_storeu_ps(x + j, in, e);
    sum[u] = _mm512_add_ps(sum[u], e);
  }
  alignas(64) float t[16];
  _mm512_store_ps(t, _mm512_add_ps(sum[0], sum[1]));
  float s = 0.0f;
  for (int u = 0; u < 16; ++u) s += t[u];
  return s;
}

// What a tile does before it stores (gemm_direct_rows): kPlain is
// alpha * AB + beta * C; the others apply the RowOp to x = alpha * AB, with
// row and p already at the tile's first row (and column).
enum Epi { kPlain, kExpRows, kGradRows };
struct RowArgs {
  const float* row = nullptr;
  const float* p = nullptr;
  int64_t ldp = 0;
  // prefetch B's row k + prefetch_rows at row k (tile, below): set for a
  // row-major B, whose rows lie a row of B apart; not for panels, whose rows
  // follow each other and which the hardware prefetcher finds by itself.
  // (The distance as one int64_t field in place of the flag changed how GCC
  // allocated the tile's registers: it kept B's vectors on the stack and
  // the own kernel ran at half its rate.)
  bool prefetch_b = false;
  int32_t prefetch_rows = 0;  // GemmParams::prefetch
};

// The tile's start: its C lines prefetched, its accumulators zero.
template <int MR, int NV>
TRIDENT_AVX512 inline __attribute__((always_inline)) void tile_start(const float* C, int64_t ldc,
                                                                     __m512 (&c)[MR][NV]) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    // the lines of the row's first and last float (of 16 NV): all it spans when
    // aligned; an unaligned row of 32 floats leaves its middle line to the loads
    _mm_prefetch(reinterpret_cast<const char*>(C + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(C + r * ldc + 16 * NV - 1), _MM_HINT_T0);
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
  }
}

// The K loop: c += op(A) B, one row of B (and MR elements of A) per k.
template <int MR, int NV, bool TRANS>
TRIDENT_AVX512 inline __attribute__((always_inline)) void tile_accumulate(
    int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, __mmask16 last,
    bool prefetch_b, int64_t distance, __m512 (&c)[MR][NV]) {
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    // a prefetch never faults: past B's last row it is only wasted
    if (prefetch_b) {
      _mm_prefetch(reinterpret_cast<const char*>(b + distance), _MM_HINT_T0);
      if constexpr (NV == 2)
        _mm_prefetch(reinterpret_cast<const char*>(b + distance + 16), _MM_HINT_T0);
    }
    __m512 bv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      bv[v] = v + 1 < NV ? _mm512_loadu_ps(b + 16 * v) : _mm512_maskz_loadu_ps(last, b + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(TRANS ? A[k * lda + r] : A[r * lda + k]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) c[r][v] = _mm512_fmadd_ps(a, bv[v], c[r][v]);
    }
  }
}

// One vector of the tile's result stored at dst (lanes m) after the epilogue
// EPI; r is its row in the tile, p its columns' offset in ra.p's row.
template <int EPI>
TRIDENT_AVX512 inline __attribute__((always_inline)) void tile_store_vector(__m512 al, __m512 be,
                                                                            float beta, __m512 acc,
                                                                            float* dst, __mmask16 m,
                                                                            const RowArgs& ra,
                                                                            int r, int64_t p) {
  if constexpr (EPI == kPlain) {
    // beta 0: C is not read (it may hold anything, NaN included)
    const __m512 x =
        beta != 0.0f ? _mm512_fmadd_ps(al, acc, _mm512_mul_ps(be, _mm512_maskz_loadu_ps(m, dst)))
                     : _mm512_mul_ps(al, acc);
    _mm512_mask_storeu_ps(dst, m, x);
  } else {
    // alpha * AB rounded as the plain tile stores it (a _round_ intrinsic is
    // not contracted with the subtraction into one fused multiply-add)
    const __m512 x = _mm512_sub_ps(_mm512_mul_round_ps(al, acc, _MM_FROUND_CUR_DIRECTION),
                                   _mm512_set1_ps(ra.row[r]));
    if constexpr (EPI == kExpRows) {
      _mm512_mask_storeu_ps(dst, m, exp16(x));
    } else {
      const __m512 pv = _mm512_maskz_loadu_ps(m, ra.p + r * ra.ldp + p);
      _mm512_mask_storeu_ps(dst, m, _mm512_mul_ps(pv, x));
    }
  }
}

// C[0:MR, 0:16 NV] (+)= alpha * op(A) B over all K, the last vector's
// columns selected by `last`. The MR x NV accumulators stay in registers
// (16 of 32); each k loads NV vectors of B and broadcasts MR elements of A.
//
// Two software prefetches, which change no value. The tile's C lines are
// asked for before the K loop, so that the read of beta * C (a weight
// gradient accumulated over micro-batches, last touched a layer ago) and
// the stores arrive while the loop runs instead of stalling the tile's end
// one miss at a time. And B's row k + kPrefetchB is asked for at row k:
// the first row tile of a column block reads that block's rows of B from
// beyond the first-level cache (rows a whole row of B apart: kilobytes),
// and the hardware prefetcher does not run far enough ahead of a K loop
// this short. On a Zen 5 core (full-width AVX-512) the two together made
// the benchmark model's step 0.90x as long (cpu-2026-12-04-zen5.md);
// prefetching A as well made it slower there, and so did B's prefetch in
// the attention's GEMMs, whose B is in panels (1.08x its fwd + bwd time at
// seq 4096, head_dim 128), so those tiles go without it. The distance is
// the host's (GemmParams::prefetch): 8 rows as measured above, and on Zen 4.
template <int MR, int NV, bool TRANS, int EPI = kPlain>
TRIDENT_AVX512 inline __attribute__((always_inline)) void tile(int64_t K, float alpha,
                                                               const float* A, int64_t lda,
                                                               const float* B, int64_t ldb,
                                                               float beta, float* C, int64_t ldc,
                                                               __mmask16 last, RowArgs ra) {
  __m512 c[MR][NV];
  tile_start<MR, NV>(C, ldc, c);
  tile_accumulate<MR, NV, TRANS>(K, A, lda, B, ldb, last, ra.prefetch_b, ra.prefetch_rows * ldb, c);
  const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* cr = C + r * ldc;
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v + 1 < NV ? __mmask16(0xFFFF) : last;
      tile_store_vector<EPI>(al, be, beta, c[r][v], cr + 16 * v, m, ra, r, 16 * v);
    }
  }
}

using TileFn = void (*)(int64_t, float, const float*, int64_t, const float*, int64_t, float, float*,
                        int64_t, __mmask16, RowArgs);

// The row tiles of one column block: the full ones of kMR rows inlined in one
// loop (no call per tile, which counts where K is short), the last, shorter
// one through the table.
template <int NV, bool TRANS, int EPI>
TRIDENT_AVX512 void strip(int64_t M, int64_t K, float alpha, const float* A, int64_t lda,
                          const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                          __mmask16 last, RowArgs ra, const TileFn* rest) {
  int64_t m0 = 0;
  for (; m0 + kMR <= M; m0 += kMR) {
    RowArgs r = ra;
    if (ra.row) r.row = ra.row + m0;
    if (ra.p) r.p = ra.p + m0 * ra.ldp;
    tile<kMR, NV, TRANS, EPI>(K, alpha, TRANS ? A + m0 : A + m0 * lda, lda, B, ldb, beta,
                              C + m0 * ldc, ldc, last, r);
  }
  if (m0 < M) {
    RowArgs r = ra;
    if (ra.row) r.row = ra.row + m0;
    if (ra.p) r.p = ra.p + m0 * ra.ldp;
    rest[M - m0 - 1](K, alpha, TRANS ? A + m0 : A + m0 * lda, lda, B, ldb, beta, C + m0 * ldc, ldc,
                     last, r);
  }
}

using StripFn = void (*)(int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                         float, float*, int64_t, __mmask16, RowArgs, const TileFn*);
// kStrips[kind][vectors - 1], kind: 0 by rows, 1 transposed, 2 kExpRows, 3 kGradRows; the tiles
// of fewer rows in kRest[kind][vectors - 1][rows - 1]
constexpr StripFn kStrips[4][kNV] = {{&strip<1, false, kPlain>, &strip<2, false, kPlain>},
                                     {&strip<1, true, kPlain>, &strip<2, true, kPlain>},
                                     {&strip<1, false, kExpRows>, &strip<2, false, kExpRows>},
                                     {&strip<1, false, kGradRows>, &strip<2, false, kGradRows>}};
template <int NV, bool TRANS, int EPI, int... R>
constexpr std::array<TileFn, kMR> rest_of(std::integer_sequence<int, R...>) {
  return {{&tile<R + 1, NV, TRANS, EPI>...}};
}
template <bool TRANS, int EPI>
constexpr std::array<std::array<TileFn, kMR>, kNV> rest_kind() {
  return {{rest_of<1, TRANS, EPI>(std::make_integer_sequence<int, kMR>{}),
           rest_of<2, TRANS, EPI>(std::make_integer_sequence<int, kMR>{})}};
}
constexpr std::array<std::array<TileFn, kMR>, kNV> kRest[4] = {
    rest_kind<false, kPlain>(), rest_kind<true, kPlain>(), rest_kind<false, kExpRows>(),
    rest_kind<false, kGradRows>()};

// Column blocks outside, row tiles inside: one block's K x 32 slice of B is
// read by every row tile while it is in the first-level cache, and A (the
// smaller re-read when the row tile is 8 rows and the block 32 columns)
// comes from the second level. With a row block (GemmParams::mc, 0 on the
// hosts measured so far) the column blocks run over mc rows of A at a time,
// which keeps that block of A in L2; every element of C is the same chain.
TRIDENT_AVX512 void gemm_avx512(bool a_trans, int64_t M, int64_t N, int64_t K, float alpha,
                                const float* A, int64_t lda, const float* B, int64_t ldb,
                                float beta, float* C, int64_t ldc, const GemmParams& gp) {
  const int64_t mc = gp.mc > 0 ? gp.mc : M;
  const int kind = a_trans ? 1 : 0;
  RowArgs ra;
  ra.prefetch_b = gp.prefetch > 0;
  ra.prefetch_rows = int32_t(gp.prefetch);
  for (int64_t m0 = 0; m0 < M; m0 += mc) {
    const int64_t mb = std::min(mc, M - m0);
    const float* a = a_trans ? A + m0 : A + m0 * lda;
    for (int64_t n0 = 0; n0 < N; n0 += kNR) {
      const int64_t nw = std::min(kNR, N - n0);
      const int nv = int((nw + 15) / 16);
      const __mmask16 last = __mmask16((1u << (nw - 16 * (nv - 1))) - 1u);
      kStrips[kind][nv - 1](mb, K, alpha, a, lda, B + n0, ldb, beta, C + m0 * ldc + n0, ldc, last,
                            ra, kRest[kind][nv - 1].data());
    }
  }
}

// gemm_avx512's loops over B in panels: column blocks follow the panel grid
// (a first block up to the next panel boundary when col0 is inside a panel),
// each block's rows kPanel floats apart in one contiguous panel. kind: as in
// kStrips (by rows, transposed, or a RowOp's with row and P).
TRIDENT_AVX512 void gemm_panels_avx512(int kind, int64_t M, int64_t N, int64_t K, float alpha,
                                       const float* A, int64_t lda, PanelB B, float beta, float* C,
                                       int64_t ldc, const float* row, const float* P, int64_t ldp) {
  for (int64_t n0 = 0; n0 < N;) {
    const int64_t c = B.col0 + n0, o = c % kPanel;
    const int64_t nw = std::min(kPanel - o, N - n0);
    const float* b = B.p + (c / kPanel) * B.stride + o;
    const int nv = int((nw + 15) / 16);
    const __mmask16 last = __mmask16((1u << (nw - 16 * (nv - 1))) - 1u);
    RowArgs ra;
    ra.row = row;
    ra.p = P ? P + n0 : nullptr;
    ra.ldp = ldp;
    kStrips[kind][nv - 1](M, K, alpha, A, lda, b, kPanel, beta, C + n0, ldc, last, ra,
                          kRest[kind][nv - 1].data());
    n0 += nw;
  }
}

// One block of up to 16 x 16: xt[c * ldt + r] = x[r * ld + c] for r < rows,
// c < cols. Three rounds of shuffles (pairs of floats, pairs of pairs,
// 128-bit lanes) turn 16 loaded rows into 16 columns.
TRIDENT_AVX512 void transpose16(const float* x, int64_t ld, int rows, int cols, float* xt,
                                int64_t ldt) {
  const __mmask16 cm = __mmask16((1u << cols) - 1u), rm = __mmask16((1u << rows) - 1u);
  __m512 r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_maskz_loadu_ps(cm, x + i * ld) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // per group of four rows g, u[4g + j] holds, in 128-bit lane L, column 4L + j of those rows
#pragma GCC unroll 4
  for (int g = 0; g < 16; g += 4) {
    const __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
    const __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
    r[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512 v = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
    const __m512 w = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);
    const __m512 v2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    const __m512 w2 = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
    const __m512 col[4] = {_mm512_shuffle_f32x4(v, v2, 0x88), _mm512_shuffle_f32x4(w, w2, 0x88),
                           _mm512_shuffle_f32x4(v, v2, 0xDD), _mm512_shuffle_f32x4(w, w2, 0xDD)};
#pragma GCC unroll 4
    for (int l = 0; l < 4; ++l)
      if (4 * l + j < cols) _mm512_mask_storeu_ps(xt + (4 * l + j) * ldt, rm, col[l]);
  }
}

TRIDENT_AVX512 void transpose_avx512(const float* x, int64_t ld, int64_t rows, int64_t cols,
                                     float* xt, int64_t ldt) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16)
      transpose16(x + r0 * ld + c0, ld, int(std::min<int64_t>(16, rows - r0)),
                  int(std::min<int64_t>(16, cols - c0)), xt + c0 * ldt + r0, ldt);
}

TRIDENT_AVX512 void transpose_panels_avx512(const float* x, int64_t ld, int64_t rows, int64_t cols,
                                            float* xp, int64_t stride) {
  for (int64_t r0 = 0; r0 < rows; r0 += 16)
    for (int64_t c0 = 0; c0 < cols; c0 += 16)
      transpose16(x + r0 * ld + c0, ld, int(std::min<int64_t>(16, rows - r0)),
                  int(std::min<int64_t>(16, cols - c0)),
                  xp + (r0 / kPanel) * stride + c0 * kPanel + r0 % kPanel, kPanel);
}

// C = alpha * A Wᵀ + beta * C with W [N, K] by rows (a linear layer's
// forward). Per column block of kNR, the block's rows of W (one contiguous
// run of kNR x K floats) are transposed into `panel`, which stays in the
// first- or second-level cache while every row tile of A reads it. The
// weights of an MoE expert are read once per micro-batch and come from
// beyond the caches, so the next block's rows are asked for while this
// block's row tiles run: a share of them before each nt_rows rows
// (GemmParams::nt_rows, 16 on the hosts measured so far). (Asked
// for all at once, the loop stalled on the outstanding misses: on a Zen 5
// core, with 96 cold 256 x 512 weights in turn, the GEMMs ran at 244-257
// GFLOP/s spread and 230-236 at once; in the training step the two were
// the same within the noise.)
TRIDENT_AVX512 void gemm_nt_avx512(int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                                   int64_t lda, const float* W, int64_t ldw, float beta, float* C,
                                   int64_t ldc, float* panel, int64_t nt_rows) {
  for (int64_t n0 = 0; n0 < N; n0 += kNR) {
    const int64_t nw = std::min(kNR, N - n0);
    transpose_panels_avx512(W + n0 * ldw, ldw, nw, K, panel, K * kPanel);
    const int nv = int((nw + 15) / 16);
    const __mmask16 last = __mmask16((1u << (nw - 16 * (nv - 1))) - 1u);
    // the next block's lines of W, spread over this block's row chunks
    const char* next = reinterpret_cast<const char*>(W + (n0 + kNR) * ldw);
    const int64_t lines =
        n0 + kNR < N ? ((std::min(kNR, N - n0 - kNR) - 1) * ldw + K) * 4 / 64 + 1 : 0;
    const int64_t chunks = (M + nt_rows - 1) / nt_rows, per = (lines + chunks - 1) / chunks;
    int64_t line = 0;
    for (int64_t m0 = 0; m0 < M; m0 += nt_rows) {
      for (const int64_t end = std::min(lines, line + per); line < end; ++line)
        _mm_prefetch(next + 64 * line, _MM_HINT_T0);
      kStrips[0][nv - 1](std::min(nt_rows, M - m0), K, alpha, A + m0 * lda, lda, panel, kPanel,
                         beta, C + m0 * ldc + n0, ldc, last, RowArgs{}, kRest[0][nv - 1].data());
    }
  }
}

#pragma GCC diagnostic pop

bool detect_native() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma"); }
#else
bool detect_native() { return false; }
#endif

}  // namespace

bool gemm_direct_native() {
  static const bool native = detect_native();
  return native;
}

void gemm_direct(const Ctx& ctx, bool a_trans, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc) {
  if (M == 0 || N == 0) return;
#ifdef TRIDENT_GEMM_AVX512
  if (gemm_direct_native()) {
    gemm_avx512(a_trans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, gemm_params());
    return;
  }
#endif
  cpu::sgemm(ctx, a_trans, false, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_direct_nt(const Ctx& ctx, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* W, int64_t ldw, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
#ifdef TRIDENT_GEMM_AVX512
  const GemmParams& gp = gemm_params();
  if (gemm_direct_native() && K <= gp.kc) {
    // one panel per thread, grown to the largest K seen (at most kc x 128
    // bytes: 128 KiB at Zen 4's kc 1024): the call may run inside another
    // kernel's use of the workspace (SwiGLU's)
    static thread_local std::vector<float> panel;
    if (panel.size() < size_t(K * kPanel)) panel.resize(size_t(K * kPanel));
    gemm_nt_avx512(M, N, K, alpha, A, lda, W, ldw, beta, C, ldc, panel.data(), gp.nt_rows);
    return;
  }
#endif
  cpu::sgemm(ctx, false, true, M, N, K, alpha, A, lda, W, ldw, beta, C, ldc);
}

void gemm_direct_panels(bool a_trans, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, PanelB B, float beta, float* C, int64_t ldc) {
  TRIDENT_CHECK(gemm_direct_native(), "gemm_direct_panels: only where gemm_direct is native");
#ifdef TRIDENT_GEMM_AVX512
  gemm_panels_avx512(a_trans ? 1 : 0, M, N, K, alpha, A, lda, B, beta, C, ldc, nullptr, nullptr, 0);
#endif
}

void pack_panels(const float* x, int64_t ld, int64_t rows, int64_t cols, float* xp,
                 int64_t stride) {
  for (int64_t c0 = 0; c0 < cols; c0 += kPanel) {
    const int64_t w = std::min(kPanel, cols - c0);
    float* panel = xp + (c0 / kPanel) * stride;
    // a whole panel row by a copy of constant size (inlined; the general
    // std::copy was a library call per 32 floats)
    if (w == kPanel)
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(panel + r * kPanel, x + r * ld + c0, kPanel * sizeof(float));
    else
      for (int64_t r = 0; r < rows; ++r)
        std::copy(x + r * ld + c0, x + r * ld + c0 + w, panel + r * kPanel);
  }
}

void gemm_direct_rows(RowOp op, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                      int64_t lda, PanelB B, float* C, int64_t ldc, const float* row,
                      const float* P, int64_t ldp) {
  TRIDENT_CHECK(gemm_direct_native(), "gemm_direct_rows: only where gemm_direct is native");
  TRIDENT_CHECK(op != RowOp::kGrad || P != nullptr, "gemm_direct_rows: kGrad needs P");
#ifdef TRIDENT_GEMM_AVX512
  gemm_panels_avx512(op == RowOp::kExp ? 2 : 3, M, N, K, alpha, A, lda, B, 0.0f, C, ldc, row, P,
                     ldp);
#endif
}

void transpose_panels(const float* x, int64_t ld, int64_t rows, int64_t cols, float* xp,
                      int64_t stride) {
  TRIDENT_CHECK(gemm_direct_native(), "transpose_panels: only where gemm_direct is native");
#ifdef TRIDENT_GEMM_AVX512
  transpose_panels_avx512(x, ld, rows, cols, xp, stride);
#endif
}

float row_max_native(const float* x, int64_t n) {
  TRIDENT_CHECK(gemm_direct_native(), "row_max_native: only where gemm_direct is native");
#ifdef TRIDENT_GEMM_AVX512
  return row_max_avx512(x, n);
#else
  return 0.0f;
#endif
}

float exp_shift_sum_native(float* x, int64_t n, float m) {
  TRIDENT_CHECK(gemm_direct_native(), "exp_shift_sum_native: only where gemm_direct is native");
#ifdef TRIDENT_GEMM_AVX512
  return exp_shift_sum_avx512(x, n, m);
#else
  return 0.0f;
#endif
}

void transpose_rows(const float* x, int64_t ld, int64_t rows, int64_t cols, float* xt,
                    int64_t ldt) {
#ifdef TRIDENT_GEMM_AVX512
  if (gemm_direct_native()) {
    transpose_avx512(x, ld, rows, cols, xt, ldt);
    return;
  }
#endif
  constexpr int64_t kRows = 16;  // rows read together, so that xt is written in runs
  for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
    const int64_t n = std::min(kRows, rows - r0);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < n; ++r) xt[c * ldt + r0 + r] = x[(r0 + r) * ld + c];
  }
}

}  // namespace trident::kernels::cpu
