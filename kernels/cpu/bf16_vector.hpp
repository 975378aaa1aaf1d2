// fp32 -> bf16 rounding of sixteen or thirty-two floats at a time, bit for
// bit round_to_bf16's (bf16_round.hpp), shared by the vector conversions
// (bf16_convert.cpp) and the native bf16 GEMM (gemm_bf16.cpp).
//
// Two ways: round16 in AVX-512F integer arithmetic (add 0x7fff plus the
// kept lowest bit, a NaN made quiet), and vcvtne(2)ps2bf16 (AVX512-BF16),
// which rounds the same way (nearest even, a NaN's top bits kept with the
// quiet bit set; MXCSR is not read) except that it flushes a denormal input
// to a signed zero. round32 / round16_bf16 use vcvtne and give a vector
// holding a denormal (exponent 0, mantissa not 0) to round16 instead, so
// every lane is round_to_bf16's.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define TRIDENT_BF16_NATIVE 1
#include <immintrin.h>
#define TRIDENT_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
#define TRIDENT_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,prfchw")))

namespace trident::kernels::cpu::vec {

// GCC 12's AVX-512 intrinsics start from an "undefined" register that
// -W(maybe-)uninitialized reports when they are inlined; every lane of their
// results is defined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The rounding of round_to_bf16 on sixteen floats' bit patterns (nearest
// even, a NaN kept quiet): each 32-bit lane holds its bf16 in the low half.
TRIDENT_AVX512_TARGET inline __m512i round16(__m512 x) {
  const __m512i exp = _mm512_set1_epi32(0x7f800000), man = _mm512_set1_epi32(0x007fffff);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan =
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp), exp) & _mm512_test_epi32_mask(u, man);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
  return _mm512_srli_epi32(r, 16);
}

// The lanes of x that are denormal (exponent 0, mantissa not 0): where
// vcvtneps2bf16 and round_to_bf16 differ.
TRIDENT_AVX512_TARGET inline __mmask16 denormals(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
         _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
}

// Sixteen floats to sixteen bf16, as round_to_bf16.
TRIDENT_BF16_TARGET inline __m256i round16_bf16(__m512 x) {
  if (denormals(x)) [[unlikely]]
    return _mm512_cvtepi32_epi16(round16(x));
  return (__m256i)_mm512_cvtneps_pbh(x);
}

// x0 then x1 (32 floats) to 32 bf16 in that order, as round_to_bf16.
TRIDENT_BF16_TARGET inline __m512i round32(__m512 x0, __m512 x1) {
  if (denormals(x0) | denormals(x1)) [[unlikely]] {
    const __m256i lo = _mm512_cvtepi32_epi16(round16(x0)), hi = _mm512_cvtepi32_epi16(round16(x1));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  return (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
}

#pragma GCC diagnostic pop

}  // namespace trident::kernels::cpu::vec
#endif
