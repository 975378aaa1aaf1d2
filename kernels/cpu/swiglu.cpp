// SwiGLU MLP forward/backward on the CPU: three linear layers each way
// (weights [out, in], as every weight), the gating done between them in
// vectorised element-wise passes (vector_math.hpp: libmvec's expf).
// The backward evaluates the sigmoid in both of its element-wise passes: a
// vector expf costs less than writing and reading back a third [T, f]
// buffer, and the scratch stays at two such buffers (what the planner's
// memory model counts).
#include "scratch.hpp"
#include "swiglu_gating.hpp"
#include "trident/kernels/backends.hpp"
#include "vector_math.hpp"

namespace trident::kernels::cpu {
namespace {

inline float sigmoid(float a) { return 1.0f / (1.0f + vexp(-a)); }

}  // namespace

// h = silu(a) * u, with silu(a) = a * s(a).
TRIDENT_CPU_CLONES void gated(const float* __restrict a, const float* __restrict u,
                              float* __restrict h, size_t n) {
  TRIDENT_SIMD
  for (size_t i = 0; i < n; ++i) h[i] = a[i] * sigmoid(a[i]) * u[i];
}

// From g = dL/dh: d(gate) = g·u·silu'(a) into dgate, d(up) = g·silu(a) over g,
// with silu'(a) = s·(1 + a·(1 − s)).
TRIDENT_CPU_CLONES void gated_backward(const float* __restrict a, const float* __restrict u,
                                       float* __restrict g, float* __restrict dgate, size_t n) {
  TRIDENT_SIMD
  for (size_t i = 0; i < n; ++i) {
    const float x = a[i], s = sigmoid(x), gi = g[i];
    dgate[i] = gi * u[i] * s * (1.0f + x * (1.0f - s));
    g[i] = gi * x * s;
  }
}

void swiglu_forward(const Ctx& ctx, const float* x, int64_t T, int64_t d, int64_t f,
                    const float* w_gate, const float* w_up, const float* w_down, float* y,
                    float* gate, float* up) {
  if (T == 0) return;
  cpu::linear_forward(ctx, x, w_gate, T, d, f, gate);
  cpu::linear_forward(ctx, x, w_up, T, d, f, up);
  const size_t n = static_cast<size_t>(T * f);
  Scratch scratch(ctx, n);
  float* h = scratch.take(n);
  gated(gate, up, h, n);
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
  gated(gate, up, h, n);
  // dWd += dyᵀ·h ; dh = dy·Wd
  cpu::linear_backward_weight(ctx, dy, h, T, f, d, dw_down);
  cpu::linear_backward_input(ctx, dy, w_down, T, f, d, dh, 0.0f);
  // h is free again: it takes d(gate), and dh becomes d(up) in place.
  gated_backward(gate, up, dh, h, n);
  cpu::linear_backward_weight(ctx, h, x, T, d, f, dw_gate);
  cpu::linear_backward_weight(ctx, dh, x, T, d, f, dw_up);
  if (dx) {
    cpu::linear_backward_input(ctx, h, w_gate, T, d, f, dx, 0.0f);
    cpu::linear_backward_input(ctx, dh, w_up, T, d, f, dx, 1.0f);
  }
}

}  // namespace trident::kernels::cpu
