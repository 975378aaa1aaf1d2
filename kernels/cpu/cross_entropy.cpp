// Softmax cross-entropy fused with its gradient: the loss needs the softmax
// anyway, so the backward costs one more pass over the row. The exponentials
// are vector expf (vector_math.hpp), summed in double in a fixed order.
#include <algorithm>
#include <cmath>

#include "scratch.hpp"
#include "trident/kernels/backends.hpp"
#include "vector_math.hpp"

namespace trident::kernels::cpu {
namespace {

TRIDENT_CPU_CLONES float row_max(const float* z, int64_t n) {
  float m = z[0];
  for (int64_t j = 1; j < n; ++j) m = std::max(m, z[j]);
  return m;
}

// e[j] = exp(z[j] - m)
TRIDENT_CPU_CLONES void exp_shift(const float* __restrict z, float m, float* __restrict e,
                                  int64_t n) {
  TRIDENT_SIMD
  for (int64_t j = 0; j < n; ++j) e[j] = vexp(z[j] - m);
}

TRIDENT_CPU_CLONES void scale_row(float* __restrict e, float a, int64_t n) {
  TRIDENT_SIMD
  for (int64_t j = 0; j < n; ++j) e[j] *= a;
}

}  // namespace

double cross_entropy(const Ctx& ctx, const float* logits, const int32_t* targets, int64_t T,
                     int64_t V, float scale, float* dlogits) {
  Scratch scratch(ctx, dlogits ? 0 : size_t(V));
  float* row = dlogits ? nullptr : scratch.take(size_t(V));
  double total = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * V;
    float* e = dlogits ? dlogits + t * V : row;
    if (targets[t] < 0) {
      if (dlogits) std::fill(e, e + V, 0.0f);
      continue;
    }
    const float mx = row_max(z, V);
    exp_shift(z, mx, e, V);
    const double sum = sum_d(e, V);
    const double lse = double(mx) + std::log(sum);
    total += lse - double(z[targets[t]]);
    if (dlogits) {
      // softmax = e / sum, scaled: one rounding of scale / sum, one per product
      scale_row(e, static_cast<float>(double(scale) / sum), V);
      e[targets[t]] -= scale;
    }
  }
  return total;
}

}  // namespace trident::kernels::cpu
