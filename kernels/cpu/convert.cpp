// fp32 <-> bf16 on the host: the rounding every backend's bf16 storage
// follows (round to nearest, ties to even, on the fp32 bit pattern).
#include <cstdint>
#include <cstring>

#include "trident/kernels/backends.hpp"

namespace trident::kernels::cpu {
namespace {

uint16_t round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return uint16_t((u >> 16) | 0x0040u);  // NaN: keep it a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace

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
