// The model's elementwise and small ops on the CPU: linear, RMSNorm, RoPE,
// embedding, cross-entropy and AdamW, each with its backward next to it.
//
// Shapes are row-major; T is the number of token rows a call works on. Every
// backward that produces a weight gradient ACCUMULATES into it (micro-batches
// add up), and every backward that produces an input gradient OVERWRITES it
// unless it says otherwise. These are the reference kernels: plain loops and
// OpenBLAS GEMMs (through kernels/gemm.hpp).
#pragma once
#include <cstdint>

namespace trident::kernels {

// ---- Linear: y[T,out] = x[T,in] · Wᵀ with W stored [out, in] ----
void linear_forward(const float* x, const float* w, int64_t T, int64_t in, int64_t out, float* y);
// dx[T,in] = dy[T,out] · W (beta = 1 adds to dx instead of overwriting).
void linear_backward_input(const float* dy, const float* w, int64_t T, int64_t in, int64_t out,
                           float* dx, float beta = 0.0f);
// dW[out,in] += dyᵀ · x.
void linear_backward_weight(const float* dy, const float* x, int64_t T, int64_t in, int64_t out,
                            float* dw);

// ---- RMSNorm: y = x / rms(x) * w over the last dimension d ----
// rstd[T] receives 1/rms per row (the backward needs it).
void rmsnorm_forward(const float* x, const float* w, int64_t T, int64_t d, float eps, float* y,
                     float* rstd);
// dx overwritten; dw (may be null) accumulated.
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                      int64_t T, int64_t d, float* dx, float* dw);

// ---- RoPE on x[T, H, D] in place, rotating pairs (i, i + D/2) by
// angle pos * theta^(-2i/D). pos are GLOBAL sequence positions, so a CP rank
// rotates its tokens exactly as the one-rank run does. ----
void rope_forward(float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D, double theta);
// The backward of a rotation is the inverse rotation (applied in place to dx).
void rope_backward(float* dx, const int64_t* pos, int64_t T, int64_t H, int64_t D, double theta);

// ---- Embedding: out[T,d] = table[ids[t]] ----
void embedding_forward(const float* table, const int32_t* ids, int64_t T, int64_t d, float* out);
// dtable[ids[t]] += dout[t].
void embedding_backward(const float* dout, const int32_t* ids, int64_t T, int64_t d,
                        float* dtable);

// ---- Cross-entropy over logits[T, V] with targets[T] (< 0: not a target).
// Returns the SUM of -log softmax(logits)[target] over target rows (double),
// and writes dlogits = scale * (softmax - onehot) for target rows, 0 for the
// others (scale = 1 / number of target tokens of the global batch). ----
double cross_entropy(const float* logits, const int32_t* targets, int64_t T, int64_t V,
                     float scale, float* dlogits);

// ---- AdamW (decoupled weight decay), step counted from 1 ----
struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};
// grad_scale multiplies g first (global-norm clipping).
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h,
                int64_t step, float grad_scale, bool decay);

// ---- small helpers ----
// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);
// Sum of squares in double (gradient norms).
double sum_squares(const float* x, int64_t n);

}  // namespace trident::kernels
