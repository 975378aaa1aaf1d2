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
//
// This header and what it includes (context.hpp, kernels/types/: the
// parameter and shape types the ops take) are the public op API: it
// includes no pointer header, so code above kernels/ sees no kernel it
// could call on raw memory (share/trident/design.md, "Who calls what";
// the ctest lint_layering holds it).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/types/adamw.hpp"
#include "trident/kernels/types/attention.hpp"
#include "trident/kernels/types/gemm_bf16.hpp"
#include "trident/kernels/types/rope.hpp"
#include "trident/kernels/types/router.hpp"

namespace trident::kernels {

// dst <- src converted to dst's dtype (f32 <-> bf16 with round to nearest
// even, or a plain copy for equal dtypes); same numel, both on ctx.device.
void convert(const Ctx& ctx, const Tensor& src, const Tensor& dst);

// ---- linear: w [out, in]; x [T, in] (any leading shape), y [T, out] ----
// packed: w's packed form (PackedBf16Weight of w itself, else an Error), or
// null. One with forms makes the call bf16 (w as rounded to bf16, whatever
// w's dtype): the CPU's native rows read it instead of packing w, and a row
// that cannot use it rounds w (the same bits). The other rows ignore it.
void linear_forward(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y,
                    const PackedBf16Weight* packed = nullptr);
void linear_backward_input(const Ctx& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx,
                           float beta = 0.0f, const PackedBf16Weight* packed = nullptr);
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
// packed: the weights' packed forms, each as linear's packed (above).
void swiglu_forward(const Ctx& ctx, const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                    const Tensor& w_down, const Tensor& y, const Tensor& gate, const Tensor& up,
                    const SwigluPacked& packed = {});
void swiglu_backward(const Ctx& ctx, const Tensor& x, const Tensor& gate, const Tensor& up,
                     const Tensor& dy, const Tensor& w_gate, const Tensor& w_up,
                     const Tensor& w_down, const Tensor& dx, const Tensor& dw_gate,
                     const Tensor& dw_up, const Tensor& dw_down, const SwigluPacked& packed = {});

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

// ==== MoE and router ====
// The permutation of token rows by a dispatch plan's index data and the
// router's maths; the semantics are those of kernels/moe.hpp and
// kernels/router.hpp. Index data: i32 experts, chosen and samples, i64
// rows, tokens and counts; the router's statistics are f64 (never staged).

// Permuted rows [S, d] as an unpermute reads them: one tensor, or blocks
// that lie apart (one per expert where the shm transport leaves them, host
// memory, f32): row r is row r - first[s] of blocks[s] for first[s] <= r <
// first[s + 1].
struct RowBlocks {
  Tensor rows;
  std::vector<Tensor> blocks;
  std::vector<int64_t> first;  // [blocks + 1], ascending

  RowBlocks() = default;
  RowBlocks(Tensor all) : rows(std::move(all)) {}  // NOLINT: a tensor is a set of rows
  RowBlocks(std::vector<Tensor> b, std::vector<int64_t> f)
      : blocks(std::move(b)), first(std::move(f)) {}
};

// ---- permute and unpermute: d = the width of out, y, dy and dx ----
// out [n, d] = rows src_row [n] (i64) of x [*, d].
void gather_rows(const Ctx& ctx, const Tensor& x, const Tensor& src_row, const Tensor& out);
// y [T, d] = sum over the k slots of copy (t, j) kept (row [T*k] i64 >= 0) of
// weight[t*k + j] (weight [T*k]; empty: 1) times rows[row[t*k + j]];
// overwritten.
void combine_rows(const Ctx& ctx, const RowBlocks& rows, const Tensor& row, const Tensor& weight,
                  int k, const Tensor& y);
// Its backward: drows [S, d] written at the rows of kept copies, dweight
// [T*k] overwritten.
void combine_rows_backward(const Ctx& ctx, const RowBlocks& rows, const Tensor& dy,
                           const Tensor& row, const Tensor& weight, int k, const Tensor& drows,
                           const Tensor& dweight);
// The permute's backward: dx [T, d] = sum over the k slots of drows[row].
void scatter_add_rows(const Ctx& ctx, const Tensor& drows, const Tensor& row, int k,
                      const Tensor& dx);
// The plan's index data from expert i32 [n] (-1: dropped): counts i64 [E],
// then row_of i64 [n] and send_token i64 [sum counts] (k copies per token).
void expert_counts(const Ctx& ctx, const Tensor& expert, const Tensor& counts);
void expert_order(const Ctx& ctx, const Tensor& expert, int k, const Tensor& counts,
                  const Tensor& row_of, const Tensor& send_token);

// ---- router of dims (T tokens, E experts, k slots) ----
// probs [T, E] and lse [T] from logits [T, E].
void router_scores(const Ctx& ctx, const RouterDims& dims, const Tensor& logits,
                   const Tensor& probs, const Tensor& lse);
// chosen i32 [T*k] and weight [T*k] from probs; bias [E] (empty: none) only selects.
void router_topk(const Ctx& ctx, const RouterDims& dims, const Tensor& probs, const Tensor& bias,
                 const Tensor& chosen, const Tensor& weight);
// stats f64 [n_samples, E + 1] from chosen and sample i32 [T].
void router_load(const Ctx& ctx, const RouterDims& dims, const Tensor& chosen, const Tensor& sample,
                 const Tensor& stats);
// f f64 [n_samples, E] and inv_tokens f64 [n_samples] from stats.
void router_frequencies(const Ctx& ctx, const RouterDims& dims, const Tensor& stats,
                        const Tensor& f, const Tensor& inv_tokens);

// One routing's tensors, as the losses and the backward read them.
struct RouterTensors {
  Tensor logits, probs, lse;  // f32 [T, E], [T, E], [T]
  Tensor chosen, weight;      // i32 [T*k], f32 [T*k]
  Tensor sample;              // i32 [T]
  Tensor f, inv_tokens;       // f64 [n_samples, E], [n_samples]
  double aux_coef = 0, z_coef = 0;
};
// shares f64 [2]: this call's tokens' aux and z shares (probs, lse, sample,
// f, inv_tokens of r are read).
void router_losses(const Ctx& ctx, const RouterDims& dims, const RouterTensors& r,
                   const Tensor& shares);
// expert i32 [T*k] and dropped i64 [1] from the group's token i64 [ranks*T],
// weight [ranks*T*k] and chosen i32 [ranks*T*k] (rank `me`'s part kept).
void router_capacity(const Ctx& ctx, const RouterDims& dims, int ranks, int me, const Tensor& token,
                     const Tensor& weight, const Tensor& chosen, int64_t capacity,
                     const Tensor& expert, const Tensor& dropped);
// dlogits [T, E] (overwritten) from dweight [T*k] and daux_scale.
void router_backward(const Ctx& ctx, const RouterDims& dims, const RouterTensors& r,
                     const Tensor& dweight, float daux_scale, const Tensor& dlogits);

}  // namespace trident::kernels
