// fp32 <-> bf16 on the host: the rounding every backend's bf16 storage
// follows (round to nearest, ties to even, on the fp32 bit pattern).
#include <cstdint>
#include <cstring>

#include "bf16_round.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/cpu_bf16.hpp"

namespace trident::kernels::cpu {

// Sixteen at a time where the CPU has AVX-512 BF16 (round_bf16: the same
// integer rounding, so the same bits; it rounds the bf16 weights' copies
// every step and the staged rows' outputs).
void to_bf16(const Ctx&, const float* x, int64_t n, uint16_t* y) {
  if (bf16_units().avx512_bf16) return round_bf16(x, n, y);
  for (int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(x[i]);
}

void from_bf16(const Ctx&, const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(x[i]) << 16;
    std::memcpy(&y[i], &u, sizeof u);
  }
}

}  // namespace trident::kernels::cpu
