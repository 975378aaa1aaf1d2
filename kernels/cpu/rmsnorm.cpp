// RMSNorm forward and backward. Row statistics are accumulated in double in
// a fixed order (vector_math.hpp), so rows split differently across ranks
// still normalise identically; the element-wise passes vectorise.
#include <cmath>

#include "trident/kernels/backends.hpp"
#include "vector_math.hpp"

namespace trident::kernels::cpu {
namespace {

TRIDENT_CPU_CLONES void scale_by(const float* __restrict x, const float* __restrict w, float r,
                                 float* __restrict y, int64_t d) {
  TRIDENT_SIMD
  for (int64_t i = 0; i < d; ++i) y[i] = x[i] * r * w[i];
}

// dx = r * (g*w - xhat*mean), dw += g*xhat, with xhat = x*r.
TRIDENT_CPU_CLONES void row_backward(const float* __restrict g, const float* __restrict x,
                                     const float* __restrict w, float r, float mean,
                                     float* __restrict dx, float* __restrict dw, int64_t d) {
  if (dw) {
    TRIDENT_SIMD
    for (int64_t i = 0; i < d; ++i) {
      const float xhat = x[i] * r;
      dx[i] = r * (g[i] * w[i] - xhat * mean);
      dw[i] += g[i] * xhat;
    }
  } else {
    TRIDENT_SIMD
    for (int64_t i = 0; i < d; ++i) dx[i] = r * (g[i] * w[i] - x[i] * r * mean);
  }
}

}  // namespace

void rmsnorm_forward(const Ctx& ctx, const float* x, const float* w, int64_t T, int64_t d,
                     float eps, float* y, float* rstd) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * d;
    const double ss = sum_squares_d(xr, d);
    const float r = static_cast<float>(1.0 / std::sqrt(ss / double(d) + double(eps)));
    rstd[t] = r;
    scale_by(xr, w, r, y + t * d, d);
  }
}

// With xhat = x * r: dx = r * (g - xhat * mean(g * xhat)), g = dy * w.
void rmsnorm_backward(const Ctx& ctx, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t d, float* dx, float* dw) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * d;
    const float* gr = dy + t * d;
    const float r = rstd[t];
    const float mean = static_cast<float>(dot3_d(gr, w, xr, d) * double(r) / double(d));
    row_backward(gr, xr, w, r, mean, dx + t * d, dw, d);
  }
}

}  // namespace trident::kernels::cpu
