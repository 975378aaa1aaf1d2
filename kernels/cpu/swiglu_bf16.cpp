// SwiGLU on the native bf16 GEMM (cpu_bf16.hpp): the f32 kernel's steps
// (swiglu.cpp) with each linear layer on gemm_bf16, the gating in f32 on
// the same element-wise passes.
#include <algorithm>

#include "scratch.hpp"
#include "swiglu_gating.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/cpu_bf16.hpp"

namespace trident::kernels::cpu {
namespace {

// A [rows, cols] operand by rows (trans: stored [cols, rows]).
Bf16Operand op(const F32OrBf16& t, bool trans, int64_t ld) { return {t.p, t.f32, trans, ld}; }
Bf16Operand op(const float* p, int64_t ld) { return {p, true, false, ld}; }

// src (n floats) into out: copied, or rounded to bf16.
void store(const float* src, int64_t n, F32OrBf16 out) {
  if (out.f32)
    std::copy_n(src, n, static_cast<float*>(out.p));
  else
    round_bf16(src, n, static_cast<uint16_t*>(out.p));
}

// t as f32: itself, or widened into buf.
const float* wide(const Ctx& ctx, F32OrBf16 t, int64_t n, float* buf) {
  if (t.f32) return static_cast<const float*>(t.p);
  cpu::from_bf16(ctx, static_cast<const uint16_t*>(t.p), n, buf);
  return buf;
}

}  // namespace

void swiglu_forward_bf16(const Ctx& ctx, const SwigluBf16& s, F32OrBf16 y, F32OrBf16 gate,
                         F32OrBf16 up) {
  if (s.T == 0) return;
  const int64_t T = s.T, d = s.d, f = s.f, n = T * f;
  Scratch scratch(ctx, size_t(3 * n));
  float *g = scratch.take(size_t(n)), *u = scratch.take(size_t(n)), *h = scratch.take(size_t(n));
  gemm_bf16(T, f, d, 1.0f, op(s.x, false, d), op(s.w_gate, true, d), 0.0f, g, f);
  gemm_bf16(T, f, d, 1.0f, op(s.x, false, d), op(s.w_up, true, d), 0.0f, u, f);
  gated(g, u, h, size_t(n));
  if (y.f32)
    gemm_bf16(T, d, f, 1.0f, op(h, f), op(s.w_down, true, f), 0.0f, static_cast<float*>(y.p), d);
  else
    gemm_bf16_out(T, d, f, 1.0f, op(h, f), op(s.w_down, true, f), static_cast<uint16_t*>(y.p), d);
  store(g, n, gate);
  store(u, n, up);
}

void swiglu_backward_bf16(const Ctx& ctx, const SwigluBf16& s, F32OrBf16 gate, F32OrBf16 up,
                          const float* dy, float* dx, float* dw_gate, float* dw_up,
                          float* dw_down) {
  if (s.T == 0) return;
  const int64_t T = s.T, d = s.d, f = s.f, n = T * f;
  Scratch scratch(ctx, size_t(4 * n));
  float *h = scratch.take(size_t(n)), *dh = scratch.take(size_t(n));
  const float* g = wide(ctx, gate, n, scratch.take(size_t(n)));
  const float* u = wide(ctx, up, n, scratch.take(size_t(n)));
  gated(g, u, h, size_t(n));
  // dWd += dyᵀ·h ; dh = dy·Wd
  gemm_bf16(d, f, T, 1.0f, {dy, true, true, d}, op(h, f), 1.0f, dw_down, f);
  gemm_bf16(T, f, d, 1.0f, op(dy, d), op(s.w_down, false, f), 0.0f, dh, f);
  // h takes d(gate), dh becomes d(up) in place
  gated_backward(g, u, dh, h, size_t(n));
  gemm_bf16(f, d, T, 1.0f, {h, true, true, f}, op(s.x, false, d), 1.0f, dw_gate, d);
  gemm_bf16(f, d, T, 1.0f, {dh, true, true, f}, op(s.x, false, d), 1.0f, dw_up, d);
  if (dx) {
    gemm_bf16(T, d, f, 1.0f, op(h, f), op(s.w_gate, false, d), 0.0f, dx, d);
    gemm_bf16(T, d, f, 1.0f, op(dh, f), op(s.w_up, false, d), 1.0f, dx, d);
  }
}

}  // namespace trident::kernels::cpu
