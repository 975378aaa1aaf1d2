// RMSNorm forward and backward (row statistics accumulated in double so that
// rows split differently across ranks still normalise identically).
#include <cmath>

#include "trident/kernels/backends.hpp"

namespace trident::kernels::cpu {

void rmsnorm_forward(const Ctx& ctx, const float* x, const float* w, int64_t T, int64_t d,
                     float eps, float* y, float* rstd) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * d;
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += double(xr[i]) * double(xr[i]);
    float r = static_cast<float>(1.0 / std::sqrt(ss / double(d) + double(eps)));
    rstd[t] = r;
    float* yr = y + t * d;
    for (int64_t i = 0; i < d; ++i) yr[i] = xr[i] * r * w[i];
  }
}

// With xhat = x * r: dx = r * (g - xhat * mean(g * xhat)), g = dy * w.
void rmsnorm_backward(const Ctx& ctx, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t d, float* dx, float* dw) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * d;
    const float* gr = dy + t * d;
    const float r = rstd[t];
    double dot = 0.0;
    for (int64_t i = 0; i < d; ++i) dot += double(gr[i]) * double(w[i]) * double(xr[i]) * r;
    const float mean = static_cast<float>(dot / double(d));
    float* dxr = dx + t * d;
    for (int64_t i = 0; i < d; ++i) {
      const float xhat = xr[i] * r;
      dxr[i] = r * (gr[i] * w[i] - xhat * mean);
      if (dw) dw[i] += gr[i] * xhat;
    }
  }
}

}  // namespace trident::kernels::cpu
