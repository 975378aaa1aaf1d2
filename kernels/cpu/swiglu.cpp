// SwiGLU MLP forward/backward on the CPU: three GEMMs each way through
// kernels::sgemm, the gating done row by row in between.
#include <cmath>

#include "scratch.hpp"
#include "trident/kernels/backends.hpp"

namespace trident::kernels::cpu {
namespace {
inline float sigmoid(float a) { return 1.0f / (1.0f + std::exp(-a)); }
}  // namespace

void swiglu_forward(const Ctx& ctx, const float* x, int64_t T, int64_t d, int64_t f,
                    const float* w_gate, const float* w_up, const float* w_down, float* y,
                    float* gate, float* up) {
  if (T == 0) return;
  cpu::sgemm(ctx, false, false, T, f, d, 1.0f, x, d, w_gate, f, 0.0f, gate, f);
  cpu::sgemm(ctx, false, false, T, f, d, 1.0f, x, d, w_up, f, 0.0f, up, f);
  Scratch scratch(ctx, size_t(T * f));
  float* h = scratch.take(size_t(T * f));
  for (int64_t i = 0; i < T * f; ++i) h[i] = gate[i] * sigmoid(gate[i]) * up[i];
  cpu::sgemm(ctx, false, false, T, d, f, 1.0f, h, f, w_down, d, 0.0f, y, d);
}

void swiglu_backward(const Ctx& ctx, const float* x, const float* gate, const float* up,
                     const float* dy, int64_t T, int64_t d, int64_t f, const float* w_gate,
                     const float* w_up, const float* w_down, float* dx, float* dw_gate,
                     float* dw_up, float* dw_down) {
  if (T == 0) return;
  const size_t n = static_cast<size_t>(T * f);
  Scratch scratch(ctx, 2 * n);
  float *h = scratch.take(n), *dh = scratch.take(n);
  for (size_t i = 0; i < n; ++i) h[i] = gate[i] * sigmoid(gate[i]) * up[i];
  // dWd += hᵀ·dy ; dh = dy·Wdᵀ
  cpu::sgemm(ctx, true, false, f, d, T, 1.0f, h, f, dy, d, 1.0f, dw_down, d);
  cpu::sgemm(ctx, false, true, T, f, d, 1.0f, dy, d, w_down, d, 0.0f, dh, f);
  // Reuse h for d(gate) and dh for d(up): silu'(a) = s(a)·(1 + a·(1 − s(a))).
  for (size_t i = 0; i < n; ++i) {
    const float a = gate[i], s = sigmoid(a);
    const float g = dh[i];
    h[i] = g * up[i] * s * (1.0f + a * (1.0f - s));
    dh[i] = g * a * s;
  }
  cpu::sgemm(ctx, true, false, d, f, T, 1.0f, x, d, h, f, 1.0f, dw_gate, f);
  cpu::sgemm(ctx, true, false, d, f, T, 1.0f, x, d, dh, f, 1.0f, dw_up, f);
  if (dx) {
    cpu::sgemm(ctx, false, true, T, d, f, 1.0f, h, f, w_gate, f, 0.0f, dx, d);
    cpu::sgemm(ctx, false, true, T, d, f, 1.0f, dh, f, w_up, f, 1.0f, dx, d);
  }
}

}  // namespace trident::kernels::cpu
