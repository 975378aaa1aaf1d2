// AdamW update with bias correction; the clipping factor is folded in so the
// gradient buffer is read once. One vectorised pass (the same operations in
// the same order per element as a scalar loop, so the same bits).
#include <cmath>

#include "trident/kernels/backends.hpp"
#include "vector_math.hpp"

namespace trident::kernels::cpu {
namespace {

struct Coefs {
  float b1, b2, eps, step_size, inv_sqrt_bc2, wd, grad_scale;
};

TRIDENT_CPU_CLONES void update(float* __restrict p, const float* __restrict g, float* __restrict m,
                               float* __restrict v, int64_t n, const Coefs k) {
  TRIDENT_SIMD
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * k.grad_scale;
    const float mi = k.b1 * m[i] + (1.0f - k.b1) * gi;
    const float vi = k.b2 * v[i] + (1.0f - k.b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps;
    float pi = p[i];
    pi -= k.wd * pi;
    p[i] = pi - k.step_size * mi / denom;
  }
}

}  // namespace

void adamw_step(const Ctx& ctx, float* p, const float* g, float* m, float* v, int64_t n,
                const AdamWHyper& h, int64_t step, float grad_scale, bool decay) {
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  Coefs k;
  k.b1 = float(h.beta1);
  k.b2 = float(h.beta2);
  k.eps = float(h.eps);
  k.step_size = float(h.lr / bc1);
  k.inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  k.wd = decay ? float(h.lr * h.weight_decay) : 0.0f;
  k.grad_scale = grad_scale;
  update(p, g, m, v, n, k);
}

}  // namespace trident::kernels::cpu
