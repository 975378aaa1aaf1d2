// Token embedding lookup and its scatter-add backward.
#include <algorithm>

#include "trident/kernels/backends.hpp"

namespace trident::kernels::cpu {

void embedding_forward(const Ctx& ctx, const float* table, const int32_t* ids, int64_t T, int64_t d,
                       float* out) {
  for (int64_t t = 0; t < T; ++t) std::copy_n(table + int64_t(ids[t]) * d, d, out + t * d);
}

void embedding_backward(const Ctx& ctx, const float* dout, const int32_t* ids, int64_t T, int64_t d,
                        float* dtable) {
  for (int64_t t = 0; t < T; ++t) {
    float* row = dtable + int64_t(ids[t]) * d;
    const float* g = dout + t * d;
    for (int64_t i = 0; i < d; ++i) row[i] += g[i];
  }
}

}  // namespace trident::kernels::cpu
