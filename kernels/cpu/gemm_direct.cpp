// gemm_direct (see gemm_direct.hpp): an AVX-512 register tile of 8 rows by
// 32 columns of C, A read by broadcast where it lies, B by vector loads of
// its rows; sgemm where the machine lacks AVX-512F or FMA.
#include "gemm_direct.hpp"

#include <algorithm>
#include <array>
#include <utility>

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

// C[0:MR, 0:16 NV] (+)= alpha * op(A) B over all K, the last vector's
// columns selected by `last`. The MR x NV accumulators stay in registers
// (16 of 32); each k loads NV vectors of B and broadcasts MR elements of A.
template <int MR, int NV, bool TRANS>
TRIDENT_AVX512 void tile(int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                         int64_t ldb, float beta, float* C, int64_t ldc, __mmask16 last) {
  __m512 c[MR][NV];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) c[r][v] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
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
  const __m512 al = _mm512_set1_ps(alpha), be = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* cr = C + r * ldc;
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v + 1 < NV ? __mmask16(0xFFFF) : last;
      // beta 0: C is not read (it may hold anything, NaN included)
      const __m512 x =
          beta != 0.0f ? _mm512_fmadd_ps(al, c[r][v],
                                         _mm512_mul_ps(be, _mm512_maskz_loadu_ps(m, cr + 16 * v)))
                       : _mm512_mul_ps(al, c[r][v]);
      _mm512_mask_storeu_ps(cr + 16 * v, m, x);
    }
  }
}

using TileFn = void (*)(int64_t, float, const float*, int64_t, const float*, int64_t, float, float*,
                        int64_t, __mmask16);

// kTiles[trans][rows - 1][vectors - 1]
template <bool TRANS, int... R>
constexpr std::array<std::array<TileFn, kNV>, kMR> tiles_of(std::integer_sequence<int, R...>) {
  return {{{&tile<R + 1, 1, TRANS>, &tile<R + 1, 2, TRANS>}...}};
}
constexpr std::array<std::array<TileFn, kNV>, kMR> kTiles[2] = {
    tiles_of<false>(std::make_integer_sequence<int, kMR>{}),
    tiles_of<true>(std::make_integer_sequence<int, kMR>{})};

// Column blocks outside, row tiles inside: one block's K x 32 slice of B is
// read by every row tile while it is in the first-level cache, and A (the
// smaller re-read when the row tile is 8 rows and the block 32 columns)
// comes from the second level.
TRIDENT_AVX512 void gemm_avx512(bool a_trans, int64_t M, int64_t N, int64_t K, float alpha,
                                const float* A, int64_t lda, const float* B, int64_t ldb,
                                float beta, float* C, int64_t ldc) {
  for (int64_t n0 = 0; n0 < N; n0 += kNR) {
    const int64_t nw = std::min(kNR, N - n0);
    const int nv = int((nw + 15) / 16);
    const __mmask16 last = __mmask16((1u << (nw - 16 * (nv - 1))) - 1u);
    for (int64_t m0 = 0; m0 < M; m0 += kMR) {
      const int mr = int(std::min<int64_t>(kMR, M - m0));
      const float* a = a_trans ? A + m0 : A + m0 * lda;
      kTiles[a_trans][mr - 1][nv - 1](K, alpha, a, lda, B + n0, ldb, beta, C + m0 * ldc + n0, ldc,
                                      last);
    }
  }
}

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
    gemm_avx512(a_trans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
#endif
  cpu::sgemm(ctx, a_trans, false, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace trident::kernels::cpu
