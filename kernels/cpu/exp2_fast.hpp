// The native bf16 kernels' exponential (attention_bf16_tile.hpp's softmax,
// swiglu_bf16.cpp's sigmoid): 2^x on 16 fp32 lanes, inlined, in place of
// libmvec's expf where the result feeds a bf16 operand. Host only, x86-64
// with GCC or Clang (TRIDENT_EXP2_FAST); callers check AVX-512 F and DQ
// (every AVX512-BF16 CPU has both) before running any of it.
#pragma once
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#define TRIDENT_EXP2_FAST 1
#include <immintrin.h>
#define TRIDENT_EXP2_TARGET __attribute__((target("avx512f,avx512dq,fma")))
#define TRIDENT_EXP2_INLINE TRIDENT_EXP2_TARGET inline __attribute__((always_inline))

// GCC 12's AVX-512 intrinsics start from an "undefined" register that
// -W(maybe-)uninitialized reports when inlined; every lane is defined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace trident::kernels::cpu {

// log2(e): e^x = 2^(x log2(e)); the attention keeps its scores in log2 units
// (the scale times log2(e) folded into the product's scaling).
constexpr float kLog2e = 1.44269504088896341f;

// 2^x in fp32: x = n + f with n = floor(x) and f = x - floor(x) in [0, 1)
// (vreduceps), 2^f by its degree-4 minimax polynomial (relative error below
// 2.7e-6 in fp32, against the 2^-9 of a bf16 value it feeds), times 2^n by
// vscalefps (which takes floor(x) itself). 0 below -126 (no denormals) and
// for -inf (a masked score); +inf above 128; NaN kept. Seven instructions
// against the thirteen of exp with a two-constant ln2 reduction and a
// degree-6 Taylor polynomial.
TRIDENT_EXP2_INLINE __m512 exp2_fast(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.353416778e-02f), f, _mm512_set1_ps(5.201146007e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.414427549e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.930038333e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.000002623e+00f));
  return _mm512_maskz_scalef_ps(live, p, x);
}

// The lanes of a 16-float vector that hold one of the `left` values still to
// do (all 16 once left >= 16): the mask of a row's tail.
inline __mmask16 lanes16(int64_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
}

// y[i] = exp2_fast(x[i]) for i < n, callable from code built without
// AVX-512 (the tests).
TRIDENT_EXP2_TARGET inline void exp2_fast_rows(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    _mm512_mask_storeu_ps(y + i, m, exp2_fast(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

}  // namespace trident::kernels::cpu

#pragma GCC diagnostic pop

#endif
