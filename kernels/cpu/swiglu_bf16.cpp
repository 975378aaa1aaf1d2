// SwiGLU on the native bf16 GEMM (cpu_bf16.hpp): the f32 kernel's steps
// (swiglu.cpp) with each linear layer on gemm_bf16 (gate and up, and their
// weight gradients, as gemm_bf16_pair: x packed once for both), the gating
// in f32 with the sigmoid on exp2_fast (gated_fast, swiglu_gating.hpp). What a GEMM reads next (h,
// d(gate), d(up)) is rounded to bf16 in the gating's pass, chunk by chunk, instead of kept in f32
// and rounded as the GEMM packs it (the same bits, half the bytes written and read twice); gate and
// up are widened chunk by chunk.
#include <algorithm>

#include "exp2_fast.hpp"
#include "scratch.hpp"
#include "swiglu_gating.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/cpu_bf16.hpp"

namespace trident::kernels::cpu {
namespace {

// The gating passes run over chunks of kChunk elements (a multiple of the
// vector loops' widths, so every element takes the same code path as in one
// call over all n: the same bits), in f32 on the stack, and write bf16.
constexpr size_t kChunk = 1024;

// A [rows, cols] operand by rows (trans: stored [cols, rows]).
Bf16Operand op(const F32OrBf16& t, bool trans, int64_t ld) { return {t.p, t.f32, trans, ld}; }
Bf16Operand op(const float* p, int64_t ld) { return {p, true, false, ld}; }
Bf16Operand op(const uint16_t* p, bool trans, int64_t ld) { return {p, false, trans, ld}; }
// Weight i (gate, up, down) as op(B): Wᵀ (trans) or W, with its packed form
// where it has one.
Bf16Operand weight(const SwigluBf16& s, int i, bool trans) {
  const F32OrBf16& w = i == 0 ? s.w_gate : i == 1 ? s.w_up : s.w_down;
  const Bf16PackedWeight& p = s.packed[i];
  return {w.p, w.f32, trans, i < 2 ? s.d : s.f, trans ? p.nt : p.nn};
}

// src (n floats) into out at element i: copied, or rounded to bf16.
void store(const float* src, size_t n, F32OrBf16 out, size_t i) {
  if (out.f32)
    std::copy_n(src, n, static_cast<float*>(out.p) + i);
  else
    round_bf16(src, int64_t(n), static_cast<uint16_t*>(out.p) + i);
}

// Elements [i, i + n) of t as f32: a pointer into it, or widened into buf.
const float* wide(F32OrBf16 t, size_t i, size_t n, float* buf) {
  if (t.f32) return static_cast<const float*>(t.p) + i;
  widen_bf16(static_cast<const uint16_t*>(t.p) + i, int64_t(n), buf);
  return buf;
}

// Forward, one pass: h = silu(g) u rounded to bf16 into h16; g and u (f32)
// stored into gate and up.
void gate_forward(const float* g, const float* u, size_t n, uint16_t* h16, F32OrBf16 gate,
                  F32OrBf16 up) {
  float h[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = std::min(kChunk, n - i);
    gated_fast(g + i, u + i, h, m);
    round_bf16(h, int64_t(m), h16 + i);
    store(g + i, m, gate, i);
    store(u + i, m, up, i);
  }
}

// Backward's first pass: h = silu(gate) up, rounded to bf16.
void gate_again(F32OrBf16 gate, F32OrBf16 up, size_t n, uint16_t* h16) {
  float g[kChunk], u[kChunk], h[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = std::min(kChunk, n - i);
    gated_fast(wide(gate, i, m, g), wide(up, i, m, u), h, m);
    round_bf16(h, int64_t(m), h16 + i);
  }
}

// Backward's second pass: from dh = dL/dh, d(gate) and d(up) rounded to bf16.
void gate_backward(F32OrBf16 gate, F32OrBf16 up, float* dh, size_t n, uint16_t* dgate16,
                   uint16_t* dup16) {
  float g[kChunk], u[kChunk], dg[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = std::min(kChunk, n - i);
    gated_backward_fast(wide(gate, i, m, g), wide(up, i, m, u), dh + i, dg, m);
    round_bf16(dg, int64_t(m), dgate16 + i);
    round_bf16(dh + i, int64_t(m), dup16 + i);
  }
}

}  // namespace

#ifdef TRIDENT_EXP2_FAST
namespace {

// s(a) = 1 / (1 + e^-a), e^-a = 2^(-a log2(e)): 1 where e^-a falls below
// 2^-126, 0 where it overflows to +inf.
TRIDENT_EXP2_INLINE __m512 sigmoid16(__m512 a) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp2_fast(_mm512_mul_ps(a, _mm512_set1_ps(-kLog2e)));
  return _mm512_div_ps(one, _mm512_add_ps(one, e));
}

}  // namespace

// gated's h = a s(a) u, 16 lanes at a time.
TRIDENT_EXP2_TARGET void gated_fast(const float* __restrict a, const float* __restrict u,
                                    float* __restrict h, size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(int64_t(n - i));
    const __m512 x = _mm512_maskz_loadu_ps(m, a + i);
    const __m512 silu = _mm512_mul_ps(x, sigmoid16(x));
    _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

// gated_backward's d(gate) = g u s (1 + a (1 - s)) and d(up) = g a s.
TRIDENT_EXP2_TARGET void gated_backward_fast(const float* __restrict a, const float* __restrict u,
                                             float* __restrict g, float* __restrict dgate,
                                             size_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes16(int64_t(n - i));
    const __m512 x = _mm512_maskz_loadu_ps(m, a + i), s = sigmoid16(x);
    const __m512 gi = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 gus = _mm512_mul_ps(_mm512_mul_ps(gi, _mm512_maskz_loadu_ps(m, u + i)), s);
    const __m512 tail = _mm512_fmadd_ps(x, _mm512_sub_ps(one, s), one);
    _mm512_mask_storeu_ps(dgate + i, m, _mm512_mul_ps(gus, tail));
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(_mm512_mul_ps(gi, x), s));
  }
}
#else
void gated_fast(const float* __restrict a, const float* __restrict u, float* __restrict h,
                size_t n) {
  gated(a, u, h, n);
}
void gated_backward_fast(const float* __restrict a, const float* __restrict u, float* __restrict g,
                         float* __restrict dgate, size_t n) {
  gated_backward(a, u, g, dgate, n);
}
#endif

// g and u f32 (2n), h bf16 (n / 2 floats' room).
void swiglu_forward_bf16(const Ctx& ctx, const SwigluBf16& s, F32OrBf16 y, F32OrBf16 gate,
                         F32OrBf16 up) {
  if (s.T == 0) return;
  const int64_t T = s.T, d = s.d, f = s.f, n = T * f;
  Scratch scratch(ctx, size_t(2 * n + (n + 1) / 2));
  float *g = scratch.take(size_t(n)), *u = scratch.take(size_t(n));
  auto* h = reinterpret_cast<uint16_t*>(scratch.take(size_t((n + 1) / 2)));
  // g = x Wgᵀ and u = x Wuᵀ with x packed once
  gemm_bf16_pair(
      T, f, d, 1.0f,
      {{op(s.x, false, d), weight(s, 0, true), g}, {op(s.x, false, d), weight(s, 1, true), u}},
      0.0f, f);
  gate_forward(g, u, size_t(n), h, gate, up);
  if (y.f32)
    gemm_bf16(T, d, f, 1.0f, op(h, false, f), weight(s, 2, true), 0.0f, static_cast<float*>(y.p),
              d);
  else
    gemm_bf16_out(T, d, f, 1.0f, op(h, false, f), weight(s, 2, true), static_cast<uint16_t*>(y.p),
                  d);
}

// dh f32 (n), h then d(gate) bf16 and d(up) bf16 (n / 2 floats' room each):
// the same bits as gating in f32 and rounding as the GEMMs pack.
void swiglu_backward_bf16(const Ctx& ctx, const SwigluBf16& s, F32OrBf16 gate, F32OrBf16 up,
                          const float* dy, float* dx, float* dw_gate, float* dw_up,
                          float* dw_down) {
  if (s.T == 0) return;
  const int64_t T = s.T, d = s.d, f = s.f, n = T * f, half = (n + 1) / 2;
  Scratch scratch(ctx, size_t(n + 2 * half));
  float* dh = scratch.take(size_t(n));
  auto* h = reinterpret_cast<uint16_t*>(scratch.take(size_t(half)));
  auto* dup = reinterpret_cast<uint16_t*>(scratch.take(size_t(half)));
  gate_again(gate, up, size_t(n), h);
  // dWd += dyᵀ·h ; dh = dy·Wd
  gemm_bf16(d, f, T, 1.0f, {dy, true, true, d}, op(h, false, f), 1.0f, dw_down, f);
  gemm_bf16(T, f, d, 1.0f, op(dy, d), weight(s, 2, false), 0.0f, dh, f);
  uint16_t* dgate = h;  // h is read by now
  gate_backward(gate, up, dh, size_t(n), dgate, dup);
  // dWg += d(gate)ᵀ x and dWu += d(up)ᵀ x with x packed once
  gemm_bf16_pair(f, d, T, 1.0f,
                 {{op(dgate, true, f), op(s.x, false, d), dw_gate},
                  {op(dup, true, f), op(s.x, false, d), dw_up}},
                 1.0f, d);
  if (dx) {
    gemm_bf16(T, d, f, 1.0f, op(dgate, false, f), weight(s, 0, false), 0.0f, dx, d);
    gemm_bf16(T, d, f, 1.0f, op(dup, false, f), weight(s, 1, false), 1.0f, dx, d);
  }
}

}  // namespace trident::kernels::cpu
