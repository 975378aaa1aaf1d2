// AdamW update with bias correction; the clipping factor is folded in so the
// gradient buffer is read once.
#include <cmath>

#include "trident/kernels/backends.hpp"

namespace trident::kernels::cpu {

void adamw_step(const Ctx& ctx, float* p, const float* g, float* m, float* v, int64_t n,
                const AdamWHyper& h, int64_t step, float grad_scale, bool decay) {
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  const float b1 = float(h.beta1), b2 = float(h.beta2);
  const float eps = float(h.eps);
  const float step_size = float(h.lr / bc1);
  const float inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float wd = decay ? float(h.lr * h.weight_decay) : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    m[i] = b1 * m[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
    p[i] -= wd * p[i];
    p[i] -= step_size * m[i] / denom;
  }
}

}  // namespace trident::kernels::cpu
