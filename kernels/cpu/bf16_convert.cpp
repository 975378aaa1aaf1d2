// The vector fp32 <-> bf16 conversions (cpu_bf16.hpp): round_bf16 rounds
// with vcvtne2ps2bf16 where the CPU has AVX512-BF16, in AVX-512F integer
// arithmetic where it has only that, else one value at a time; each gives
// round_to_bf16's bits for every input (bf16_vector.hpp). widen_bf16 is a
// shift, sixteen at a time where the CPU has AVX-512F.
#include <cstring>

#include "bf16_round.hpp"
#include "bf16_vector.hpp"
#include "trident/kernels/cpu_bf16.hpp"

namespace trident::kernels::cpu {

namespace {

void round_scalar(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(x[i]);
}

void widen_scalar(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(x[i]) << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
}

#ifdef TRIDENT_BF16_NATIVE
// (As bf16_vector.hpp: GCC 12's intrinsics start from "undefined" registers.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// Thirty-two at a time with vcvtne2ps2bf16, sixteen, then the rest.
TRIDENT_BF16_TARGET void round_vcvtne(const float* x, int64_t n, uint16_t* y) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(y + i, vec::round32(_mm512_loadu_ps(x + i), _mm512_loadu_ps(x + i + 16)));
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        vec::round16_bf16(_mm512_loadu_ps(x + i)));
  round_scalar(x + i, n - i, y + i);
}

TRIDENT_AVX512_TARGET void round_avx512(const float* x, int64_t n, uint16_t* y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        _mm512_cvtepi32_epi16(vec::round16(_mm512_loadu_ps(x + i))));
  round_scalar(x + i, n - i, y + i);
}

TRIDENT_AVX512_TARGET void widen_avx512(const uint16_t* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    _mm512_storeu_si512(y + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  widen_scalar(x + i, n - i, y + i);
}
#pragma GCC diagnostic pop
#endif

}  // namespace

Bf16Convert bf16_convert_best() {
  static const Bf16Convert best = bf16_units().avx512_bf16 ? Bf16Convert::avx512_bf16
                                  : bf16_units().avx512    ? Bf16Convert::avx512
                                                           : Bf16Convert::scalar;
  return best;
}

void round_bf16_with(Bf16Convert how, const float* x, int64_t n, uint16_t* y) {
#ifdef TRIDENT_BF16_NATIVE
  if (how == Bf16Convert::avx512_bf16 && bf16_units().avx512_bf16) return round_vcvtne(x, n, y);
  if (how != Bf16Convert::scalar && bf16_units().avx512) return round_avx512(x, n, y);
#endif
  (void)how;
  round_scalar(x, n, y);
}

void widen_bf16_with(Bf16Convert how, const uint16_t* x, int64_t n, float* y) {
#ifdef TRIDENT_BF16_NATIVE
  if (how != Bf16Convert::scalar && bf16_units().avx512) return widen_avx512(x, n, y);
#endif
  (void)how;
  widen_scalar(x, n, y);
}

void round_bf16(const float* x, int64_t n, uint16_t* y) {
  round_bf16_with(bf16_convert_best(), x, n, y);
}

void widen_bf16(const uint16_t* x, int64_t n, float* y) {
  widen_bf16_with(bf16_convert_best(), x, n, y);
}

}  // namespace trident::kernels::cpu
