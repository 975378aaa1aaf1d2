// Counter-based random numbers.
#include "trident/core/rng.hpp"

#include <cmath>

namespace trident::rng {

float normal(uint64_t key, uint64_t index) {
  uint64_t b = bits(key, index);
  // two 26-bit uniforms from one draw; u1 in (0, 1] so log is finite
  double u1 = (static_cast<double>(b >> 38) + 1.0) / 67108864.0;
  double u2 = static_cast<double>((b >> 12) & ((1ULL << 26) - 1)) / 67108864.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void fill_normal(float* out, int64_t n, uint64_t key, uint64_t offset, float scale) {
  for (int64_t i = 0; i < n; ++i) out[i] = scale * normal(key, offset + static_cast<uint64_t>(i));
}

}  // namespace trident::rng
