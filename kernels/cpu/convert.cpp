// fp32 <-> bf16 on the host: the rounding every backend's bf16 storage
// follows (round to nearest, ties to even, on the fp32 bit pattern), in
// AVX-512 where the CPU has it (round_bf16 / widen_bf16, bf16_convert.cpp:
// the same bits).
#include <cstdint>

#include "trident/kernels/backends.hpp"
#include "trident/kernels/cpu_bf16.hpp"

namespace trident::kernels::cpu {

void to_bf16(const Ctx&, const float* x, int64_t n, uint16_t* y) { round_bf16(x, n, y); }

void from_bf16(const Ctx&, const uint16_t* x, int64_t n, float* y) { widen_bf16(x, n, y); }

}  // namespace trident::kernels::cpu
