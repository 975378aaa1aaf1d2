// The op list's bf16 conversions (backend_ops.inc) on the GPU, over the
// conversion kernels of ops.cu (__float2bfloat16: round to nearest even).
#include "common.cuh"

namespace trident::kernels::cuda {

void to_bf16(const Ctx& c, const float* x, int64_t n, uint16_t* y) {
  to_bf16(c, x, n, reinterpret_cast<Bf16*>(y));
}

void from_bf16(const Ctx& c, const uint16_t* x, int64_t n, float* y) {
  to_f32(c, reinterpret_cast<const Bf16*>(x), n, y);
}

}  // namespace trident::kernels::cuda
