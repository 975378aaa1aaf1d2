// The model's elementwise and small ops: linear, RMSNorm, RoPE, embedding,
// cross-entropy and AdamW, each with its backward next to it, and the buffer
// ops (copy, fill, add, sum of squares) that model and parallel code would
// otherwise write as loops over tensor memory.
//
// Every op takes the Ctx it runs with first; every pointer, index arrays
// included, lives on ctx.device. Shapes are row-major; T is the number of
// token rows a call works on. Every backward that produces a weight gradient
// ACCUMULATES into it (micro-batches add up), and every backward that
// produces an input gradient OVERWRITES it unless it says otherwise. The CPU
// implementations (kernels/cpu) are the reference: plain loops and OpenBLAS
// GEMMs (through kernels/gemm.hpp).
#pragma once
#include <cstdint>

#include "trident/kernels/context.hpp"
#include "trident/kernels/types/adamw.hpp"
#include "trident/kernels/types/rope.hpp"

namespace trident::kernels {

// ---- Linear: y[T,out] = x[T,in] · Wᵀ with W stored [out, in] ----
void linear_forward(const Ctx& ctx, const float* x, const float* w, int64_t T, int64_t in,
                    int64_t out, float* y);
// dx[T,in] = dy[T,out] · W (beta = 1 adds to dx instead of overwriting).
void linear_backward_input(const Ctx& ctx, const float* dy, const float* w, int64_t T, int64_t in,
                           int64_t out, float* dx, float beta = 0.0f);
// dW[out,in] += dyᵀ · x.
void linear_backward_weight(const Ctx& ctx, const float* dy, const float* x, int64_t T, int64_t in,
                            int64_t out, float* dw);

// ---- RMSNorm: y = x / rms(x) * w over the last dimension d ----
// rstd[T] receives 1/rms per row (the backward needs it).
void rmsnorm_forward(const Ctx& ctx, const float* x, const float* w, int64_t T, int64_t d,
                     float eps, float* y, float* rstd);
// dx overwritten; dw (may be null) accumulated.
void rmsnorm_backward(const Ctx& ctx, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t d, float* dx, float* dw);

// ---- RoPE on x[T, H, D] in place, rotating pairs (i, i + D/2) by angle
// pos * rope_inv_freq(rope, i, D) (kernels/types/rope.hpp). pos are GLOBAL
// sequence positions, so a CP rank rotates its tokens exactly as the
// one-rank run does. ----
void rope_forward(const Ctx& ctx, float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                  const RopeFreqs& freqs);
// The backward of a rotation is the inverse rotation (applied in place to dx).
void rope_backward(const Ctx& ctx, float* dx, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                   const RopeFreqs& freqs);

// ---- Embedding: out[T,d] = table[ids[t]] ----
void embedding_forward(const Ctx& ctx, const float* table, const int32_t* ids, int64_t T, int64_t d,
                       float* out);
// dtable[ids[t]] += dout[t].
void embedding_backward(const Ctx& ctx, const float* dout, const int32_t* ids, int64_t T, int64_t d,
                        float* dtable);

// ---- Cross-entropy over logits[T, V] with targets[T] (< 0: not a target).
// Returns the SUM of -log softmax(logits)[target] over target rows (double),
// and writes dlogits = scale * (softmax - onehot) for target rows, 0 for the
// others (scale = 1 / number of target tokens of the global batch). ----
double cross_entropy(const Ctx& ctx, const float* logits, const int32_t* targets, int64_t T,
                     int64_t V, float scale, float* dlogits);

// ---- AdamW (decoupled weight decay), step counted from 1
// (AdamWHyper: kernels/types/adamw.hpp) ----
// grad_scale multiplies g first (global-norm clipping).
void adamw_step(const Ctx& ctx, float* p, const float* g, float* m, float* v, int64_t n,
                const AdamWHyper& h, int64_t step, float grad_scale, bool decay);

// ---- buffer ops ----
// y[i] += x[i]
void add_inplace(const Ctx& ctx, float* y, const float* x, int64_t n);
// dst[i] = src[i] (the ranges do not overlap).
void copy(const Ctx& ctx, float* dst, const float* src, int64_t n);
// x[i] = value
void fill(const Ctx& ctx, float* x, int64_t n, float value);
// Sum of squares accumulated in double, in a fixed order on every backend
// (the CPU's: eight lanes, then their sum), so it repeats bit for bit (the
// gradient norm).
double sum_squares(const Ctx& ctx, const float* x, int64_t n);
// sums[k] = the sum of squares, in double, of x[ranges[2k]] .. x[ranges[2k+1]
// - 1], for k < count; ranges and sums live on ctx.device like x, so a device
// computes every range's sum without a host wait (the step guard reads all
// parameters' flags with one copy). The summation order is the backend's:
// a sum is finite exactly when its elements are (float squares cannot
// overflow a double's sum), which is what the guard asks.
void sum_squares_ranges(const Ctx& ctx, const float* x, const int64_t* ranges, int64_t count,
                        double* sums);
// y[i] = x[i] rounded to bf16 (nearest, ties to even; NaN stays NaN), as
// the 16 high bits of the fp32 pattern.
void to_bf16(const Ctx& ctx, const float* x, int64_t n, uint16_t* y);
// y[i] = the fp32 value of bf16 x[i] (exact).
void from_bf16(const Ctx& ctx, const uint16_t* x, int64_t n, float* y);

}  // namespace trident::kernels
