// The ops on tensors: what model and parallel code call. Each op takes its
// shapes and its element type from its tensors, checks that they agree and
// that every tensor lives on ctx.device, and runs the row of the op table
// (op_table.hpp) for that device and dtype. A new dtype or a new device is
// then new rows in that table, not a new name for every op (the recipes:
// share/trident/design.md).
//
// Tensors are handles (core/tensor.hpp): an output is passed as a const
// handle too, and its elements are written; views (rows(), view()) select
// part of a buffer without a copy.
//
// Element types:
//   float data   f32 or bf16, mixed freely within one call. A backend that
//                has no native bf16 kernel for an op widens the bf16 inputs
//                to f32, computes in f32 and rounds each bf16 output to
//                nearest even, so bf16 means bf16 storage with fp32
//                arithmetic on every device (the CPU reference included).
//   index data   i32 token ids and targets, i64 positions.
// The semantics of each op (what it overwrites, what it accumulates) are
// those of the pointer form it forwards to, documented in ops.hpp,
// attention.hpp and swiglu.hpp; T is always the number of rows of the
// activation, taken from its numel and the weight's width.
#pragma once
#include <cstdint>

#include "trident/core/tensor.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/ops.hpp"

namespace trident::kernels {

// dst <- src converted to dst's dtype (f32 <-> bf16 with round to nearest
// even, or a plain copy for equal dtypes); same numel, both on ctx.device.
void convert(const Ctx& ctx, const Tensor& src, const Tensor& dst);

// ---- linear: w [out, in]; x [T, in] (any leading shape), y [T, out] ----
void linear_forward(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y);
void linear_backward_input(const Ctx& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx,
                           float beta = 0.0f);
void linear_backward_weight(const Ctx& ctx, const Tensor& dy, const Tensor& x, const Tensor& dw);

// ---- RMSNorm over the last dimension d = w.numel(); rstd [T] ----
void rmsnorm_forward(const Ctx& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                     const Tensor& rstd);
void rmsnorm_backward(const Ctx& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw);

// ---- RoPE in place on x [T, H, D] (H = numel / (T * D)), pos [T] i64 ----
void rope_forward(const Ctx& ctx, const Tensor& x, const Tensor& pos, int64_t D,
                  const RopeFreqs& rope);
void rope_backward(const Ctx& ctx, const Tensor& dx, const Tensor& pos, int64_t D,
                   const RopeFreqs& rope);

// ---- embedding: table [V, d], ids [T] i32, out [T, d] ----
void embedding_forward(const Ctx& ctx, const Tensor& table, const Tensor& ids, const Tensor& out);
void embedding_backward(const Ctx& ctx, const Tensor& dout, const Tensor& ids,
                        const Tensor& dtable);

// ---- cross-entropy: logits [T, V], targets [T] i32 (< 0: no target) ----
double cross_entropy(const Ctx& ctx, const Tensor& logits, const Tensor& targets, float scale,
                     const Tensor& dlogits);

// ---- SwiGLU FFN: x [T, d], w_gate/w_up [f, d], w_down [d, f], gate/up [T, f] ----
void swiglu_forward(const Ctx& ctx, const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                    const Tensor& w_down, const Tensor& y, const Tensor& gate, const Tensor& up);
void swiglu_backward(const Ctx& ctx, const Tensor& x, const Tensor& gate, const Tensor& up,
                     const Tensor& dy, const Tensor& w_gate, const Tensor& w_up,
                     const Tensor& w_down, const Tensor& dx, const Tensor& dw_gate,
                     const Tensor& dw_up, const Tensor& dw_down);

// ---- attention of the shape s: q/out/dq/dout [Tq, H, D], k/v/dk/dv
// [Tk, Hkv, D], lse [Tq, H] f32 ----
void attention_forward(const Ctx& ctx, const AttnShape& s, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& out, const Tensor& lse);
void attention_backward(const Ctx& ctx, const AttnShape& s, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv);

// Continues an attention forward over a further key set (the ring's LSE
// merge): on entry (out, lse) hold the attention over earlier keys (lse =
// -inf and out = 0 for rows that saw none yet), on return over those and
// this call's k, v (attention.hpp's attention_forward_resume).
void attention_forward_resume(const Ctx& ctx, const AttnShape& s, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse);

// ---- AdamW on one parameter (p, g, m, v f32 of one numel) ----
void adamw_step(const Ctx& ctx, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                const AdamWHyper& h, int64_t step, float grad_scale, bool decay);

// ---- buffers ----
void add_inplace(const Ctx& ctx, const Tensor& y, const Tensor& x);  // y += x
void fill(const Ctx& ctx, const Tensor& x, float value);
double sum_squares(const Ctx& ctx, const Tensor& x);
// sums[k] (f64) = the sum of squares of x[ranges[2k]] .. x[ranges[2k+1] - 1]
// for k < sums.numel(); ranges i64 [2 * sums.numel()], every tensor on
// ctx.device, so a device sums every range without a host wait (ops.hpp's
// sum_squares_ranges: finite exactly when the range's elements are). The
// ranges are not checked against x here (they live on the device).
void sum_squares_ranges(const Ctx& ctx, const Tensor& x, const Tensor& ranges, const Tensor& sums);

}  // namespace trident::kernels
