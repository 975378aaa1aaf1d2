// The building blocks of the native bf16 attention (attention_bf16.cpp, the
// forward; attention_bf16_backward.cpp): operands packed once in the
// K-pair-interleaved layout that AVX512-BF16's vdpbf16ps reads (a 32-bit
// word holds two bf16 values of the depth), and register tiles of R rows by
// 32 columns whose results the kernels use before they store them (the
// softmax's exponentials, dS = P (dP - delta), P and dS rounded to bf16).
//
// Operand layouts, all in 32-bit words:
// - a B panel: 32 columns, word (pair p, column c) at b[p * 32 + c]; the
//   columns are keys (Kᵀ, Vᵀ: pack_rows_as_columns, the pairs over D) or
//   32 of the D columns (K, V, Q, dO: pack_row_pairs, the pairs over rows);
// - an A operand, word (row r, pair p) at a[r * RS + p * ps]: strips of Q or
//   dO rows (pack_strips: RS = 1, ps = R), P or dS by rows (RS the row
//   stride, ps = 1), Pᵀ or dSᵀ in key panels (RS = 1, ps = 32).
// Host only, x86-64 with GCC or Clang (TRIDENT_ATTN_BF16); callers check
// bf16_units().avx512_bf16 and AVX512-DQ (every AVX512-BF16 CPU so far has
// it: Cooper Lake, Sapphire Rapids and later, Zen 4 and 5) before running
// any of it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "exp2_fast.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define TRIDENT_ATTN_BF16 1
#include <immintrin.h>
#define TRIDENT_ATTN_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16,fma")))
#define TRIDENT_ATTN_INLINE TRIDENT_ATTN_TARGET inline __attribute__((always_inline))

// GCC 12's AVX-512 intrinsics (broadcasts, conversions) start from an
// "undefined" register that -W(maybe-)uninitialized reports when inlined;
// every lane of their results is defined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace trident::kernels::cpu::attn16 {

constexpr int kW = 32;  // columns of a B panel, of a register tile (two vectors)

inline int64_t pairs_of(int64_t n) { return (n + 1) / 2; }
inline int64_t round32(int64_t n) { return (n + kW - 1) / kW * kW; }
inline int64_t panels_of(int64_t n) { return (n + kW - 1) / kW; }

// Asks for the lines of `rows` bf16 rows of D values (row i at x + i * ld)
// ahead of their packing.
inline void prefetch_rows(const uint16_t* x, int64_t ld, int64_t rows, int64_t D) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < D; c += 32)
      _mm_prefetch(reinterpret_cast<const char*>(x + i * ld + c), _MM_HINT_T0);
}

// How many rows ahead of the one they copy the packing loops ask for.
constexpr int64_t kAhead = 8;

// Words [0, pairs_of(D)) of the bf16 row x (D values), word p holding x[2p]
// and x[2p + 1] (zero past D), to d[p * step].
inline void row_words(const uint16_t* x, int64_t D, uint32_t* d, int64_t step) {
  for (int64_t p = 0; p < D / 2; ++p) std::memcpy(d + p * step, x + 2 * p, sizeof(uint32_t));
  if (D % 2) d[(D / 2) * step] = x[D - 1];
}

// Rows [0, n) of x (row j at x + j * ld, D values) as B panels of a product
// over D: word (pair p, row j) at dst[(j / 32) * pairs_of(D) * 32 + p * 32 +
// j % 32]; the rows from n to round32(n) zero.
inline void pack_rows_as_columns(const uint16_t* x, int64_t ld, int64_t n, int64_t D,
                                 uint32_t* dst) {
  const int64_t Dp = pairs_of(D);
  for (int64_t j = 0; j < round32(n); ++j) {
    uint32_t* d = dst + (j / kW) * Dp * kW + j % kW;
    if (j + kAhead < n) prefetch_rows(x + (j + kAhead) * ld, ld, 1, D);
    if (j < n)
      row_words(x + j * ld, D, d, kW);
    else
      for (int64_t p = 0; p < Dp; ++p) d[p * kW] = 0u;
  }
}

// Rows [0, n) of x as B panels of a product over the rows: panel c / 32 of
// the D columns at dst + (c / 32) * stride, word (pair t, column c) = (x[2t][c],
// x[2t + 1][c]) at t * 32 + c % 32 for t < np; rows past n, columns past D zero.
TRIDENT_ATTN_TARGET inline void pack_row_pairs(const uint16_t* x, int64_t ld, int64_t n, int64_t D,
                                               int64_t np, int64_t stride, uint32_t* dst) {
  // word k of the low half: (x[k], y[k]) for k < 16; of the high half, k + 16
  alignas(64) static constexpr uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                   37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                   11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_load_si512(kLo), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t t = 0; t < np; ++t) {
    for (int64_t c = 0; c < D; c += kW) {
      const __mmask32 m = D - c >= kW ? ~__mmask32(0) : __mmask32((1u << (D - c)) - 1);
      const __m512i x0 =
          2 * t < n ? _mm512_maskz_loadu_epi16(m, x + 2 * t * ld + c) : _mm512_setzero_si512();
      const __m512i x1 = 2 * t + 1 < n ? _mm512_maskz_loadu_epi16(m, x + (2 * t + 1) * ld + c)
                                       : _mm512_setzero_si512();
      uint32_t* d = dst + (c / kW) * stride + t * kW;
      _mm512_storeu_si512(d, _mm512_permutex2var_epi16(x0, lo, x1));
      _mm512_storeu_si512(d + 16, _mm512_permutex2var_epi16(x0, hi, x1));
    }
  }
}

// Rows [0, n) of x as A strips of R rows for a product over D: word (row i,
// pair p) at dst[(i / R) * pairs_of(D) * R + p * R + i % R]; the rows up to a
// multiple of R zero.
inline void pack_strips(const uint16_t* x, int64_t ld, int64_t n, int64_t D, int R, uint32_t* dst) {
  const int64_t Dp = pairs_of(D), m = (n + R - 1) / R * R;
  for (int64_t i = 0; i < m; ++i) {
    uint32_t* d = dst + (i / R) * Dp * R + i % R;
    if (i + kAhead < n) prefetch_rows(x + (i + kAhead) * ld, ld, 1, D);
    if (i < n)
      row_words(x + i * ld, D, d, R);
    else
      for (int64_t p = 0; p < Dp; ++p) d[p * R] = 0u;
  }
}

// The columns [c0, c0 + 32) that lie in [a, b), as bits.
inline uint32_t col_mask(int64_t a, int64_t b, int64_t c0) {
  const int64_t lo = std::clamp<int64_t>(a - c0, 0, kW), hi = std::clamp<int64_t>(b - c0, 0, kW);
  if (hi <= lo) return 0u;
  return uint32_t(((uint64_t(1) << hi) - 1) & ~((uint64_t(1) << lo) - 1));
}

template <int R>
TRIDENT_ATTN_INLINE void zero_tile(__m512 (&acc)[R][2]) {
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
}

// acc[r][v] += the sum over pairs p < np of a(r, p) · b(p, 16 v ... 16 v + 15)
// for the vectors V0 <= v < V1 (both, or one half of the panel's 32 columns:
// the causal diagonal's panels): A's word (r, p) at a[r * RS + p * ps], B a
// panel from its pair 0. Each vdpbf16ps adds the two products of a pair to
// its fp32 lane.
template <int R, int RS, int V0 = 0, int V1 = 2>
TRIDENT_ATTN_INLINE void dot_tile(const uint32_t* a, int64_t ps, const uint32_t* b, int64_t np,
                                  __m512 (&acc)[R][2]) {
  for (int64_t p = 0; p < np; ++p, a += ps, b += kW) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + 16 * V0);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16 * (V1 - 1));
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r * RS]));
      if constexpr (V0 == 0) acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      if constexpr (V1 == 2) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
}

// dot_tile over the whole panel (half 0), its first 16 columns (half 1:
// the columns from 16 on are seen by no row) or its last 16 (half 2).
template <int R, int RS>
TRIDENT_ATTN_INLINE void dot_tile_half(int half, const uint32_t* a, int64_t ps, const uint32_t* b,
                                       int64_t np, __m512 (&acc)[R][2]) {
  if (half == 1)
    dot_tile<R, RS, 0, 1>(a, ps, b, np, acc);
  else if (half == 2)
    dot_tile<R, RS, 1, 2>(a, ps, b, np, acc);
  else
    dot_tile<R, RS>(a, ps, b, np, acc);
}

// Which columns of the panel at key j the keys [lo, hi) reach, for
// dot_tile_half: 1 when none from j + 16 on, 2 when none before j + 16,
// else 0.
inline int panel_half(int64_t lo, int64_t hi, int64_t j) {
  return hi <= j + 16 ? 1 : lo >= j + 16 ? 2 : 0;
}

// c[r][0:cols] += alpha * acc[r] for r < rows (row r at c + r * ldc).
template <int R>
TRIDENT_ATTN_INLINE void add_tile(const __m512 (&acc)[R][2], float* c, int64_t ldc, int rows,
                                  int64_t cols, float alpha) {
  const uint32_t bits = cols >= kW ? ~0u : (1u << cols) - 1;
  const __mmask16 m0 = __mmask16(bits), m1 = __mmask16(bits >> 16);
  const __m512 al = _mm512_set1_ps(alpha);
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {  // unrolled: the accumulators stay in registers
    if (r >= rows) break;
    float* row = c + r * ldc;
    _mm512_mask_storeu_ps(row, m0, _mm512_fmadd_ps(al, acc[r][0], _mm512_maskz_loadu_ps(m0, row)));
    _mm512_mask_storeu_ps(row + 16, m1,
                          _mm512_fmadd_ps(al, acc[r][1], _mm512_maskz_loadu_ps(m1, row + 16)));
  }
}

// kLog2e, exp2_fast and exp2_fast_rows (the softmax's exponential, the
// scores kept in log2 units): exp2_fast.hpp, in the enclosing namespace.
using cpu::exp2_fast;
using cpu::exp2_fast_rows;
using cpu::kLog2e;

// 32 values (x, then y) rounded to bf16 (nearest even), in order: the bf16
// row of a tile's 32 columns, 16 words.
TRIDENT_ATTN_INLINE __m512i bf16_row(__m512 x, __m512 y) {
  return (__m512i)_mm512_cvtne2ps_pbh(y, x);
}

// Two rows' 16 values rounded to bf16 and interleaved: word k = (x[k],
// y[k]), the pair of two rows of a column (Pᵀ's and dSᵀ's layout).
TRIDENT_ATTN_INLINE __m512i bf16_pairs(__m512 x, __m512 y) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), bf16_row(x, y));
}

}  // namespace trident::kernels::cpu::attn16

#pragma GCC diagnostic pop

#endif
