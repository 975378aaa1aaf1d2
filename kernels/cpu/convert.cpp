// fp32 <-> bf16 on the host: the rounding every backend's bf16 storage
// follows (round to nearest, ties to even, on the fp32 bit pattern).
#include <cstdint>
#include <cstring>

#include "bf16_round.hpp"
#include "trident/kernels/backends.hpp"

namespace trident::kernels::cpu {

void to_bf16(const Ctx&, const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(x[i]);
}

void from_bf16(const Ctx&, const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(x[i]) << 16;
    std::memcpy(&y[i], &u, sizeof u);
  }
}

}  // namespace trident::kernels::cpu
