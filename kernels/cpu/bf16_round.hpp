// fp32 -> bf16 rounding shared by the conversion kernel (convert.cpp) and the
// native bf16 GEMM's packing (gemm_bf16.cpp): round to nearest, ties to even,
// on the fp32 bit pattern; a NaN stays a (quiet) NaN.
#pragma once
#include <cstdint>
#include <cstring>

namespace trident::kernels::cpu {

inline uint16_t round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return uint16_t((u >> 16) | 0x0040u);  // NaN: keep it a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

}  // namespace trident::kernels::cpu
