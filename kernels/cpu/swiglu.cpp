// SwiGLU MLP forward/backward on the CPU: three linear layers each way
// (weights [out, in], as every weight), the gating done row by row between.
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
  cpu::linear_forward(ctx, x, w_gate, T, d, f, gate);
  cpu::linear_forward(ctx, x, w_up, T, d, f, up);
  Scratch scratch(ctx, size_t(T * f));
  float* h = scratch.take(size_t(T * f));
  for (int64_t i = 0; i < T * f; ++i) h[i] = gate[i] * sigmoid(gate[i]) * up[i];
  cpu::linear_forward(ctx, h, w_down, T, f, d, y);
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
  // dWd += dyᵀ·h ; dh = dy·Wd
  cpu::linear_backward_weight(ctx, dy, h, T, f, d, dw_down);
  cpu::linear_backward_input(ctx, dy, w_down, T, f, d, dh, 0.0f);
  // Reuse h for d(gate) and dh for d(up): silu'(a) = s(a)·(1 + a·(1 − s(a))).
  for (size_t i = 0; i < n; ++i) {
    const float a = gate[i], s = sigmoid(a);
    const float g = dh[i];
    h[i] = g * up[i] * s * (1.0f + a * (1.0f - s));
    dh[i] = g * a * s;
  }
  cpu::linear_backward_weight(ctx, h, x, T, d, f, dw_gate);
  cpu::linear_backward_weight(ctx, dh, x, T, d, f, dw_up);
  if (dx) {
    cpu::linear_backward_input(ctx, h, w_gate, T, d, f, dx, 0.0f);
    cpu::linear_backward_input(ctx, dh, w_up, T, d, f, dx, 1.0f);
  }
}

}  // namespace trident::kernels::cpu
