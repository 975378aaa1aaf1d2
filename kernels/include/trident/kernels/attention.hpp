// Blocked (flash-style) scaled dot-product attention on the CPU: the
// reference that ring attention builds on and that the CUDA kernels are
// checked against.
//
// The seq x seq score matrix is never materialised: queries are taken in
// blocks of kQueryBlock rows and keys in blocks of kKeyBlock, and only one
// kQueryBlock x kKeyBlock tile of scores exists at a time. Softmax is computed
// online (running row max and row sum); the row log-sum-exp (LSE) is returned
// so that partial results over disjoint key sets can be merged exactly
// (merge_partial_attention) and so that the backward pass can recompute the
// probabilities without storing them.
//
// Layouts (row-major float32, token-major):
//   q, out, dq, dout : [Tq, H,   D]
//   k, v, dk, dv     : [Tk, Hkv, D]      H % Hkv == 0 (grouped-query attention:
//                      query head h reads kv head h / (H / Hkv); K/V are
//                      addressed with a row stride, never copied per head)
//   lse              : [Tq, H] float32, natural log; -inf for a row that sees
//                      no key (its output row is then 0, and no NaN appears).
//
// The shape (AttnShape), its mask rules (which pairs are visible, with
// causal masks, packed documents and sliding windows) and its host-side
// counts are in kernels/types/attention.hpp; the fp64 reference of one row,
// attention_reference_row, in the public kernels/reference.hpp.
#pragma once
#include <cstddef>
#include <cstdint>

#include "trident/kernels/context.hpp"
#include "trident/kernels/types/attention.hpp"

namespace trident::kernels {

// out [Tq,H,D] and lse [Tq,H] are overwritten.
void attention_forward(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                       const float* v, float* out, float* lse);

// Continues a forward over a further key set: on entry (out, lse) hold the
// attention over the keys of earlier calls (lse = -inf and out = 0 for rows
// that saw none yet), on return over those keys and this call's. Same result
// as attention_forward into a partial buffer followed by
// merge_partial_attention, without the buffer or the extra pass over it: the
// earlier result seeds the online softmax. Ring attention uses it per step.
void attention_forward_resume(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                              const float* v, float* out, float* lse);

// Gradients of the attention whose (possibly merged over several calls)
// output is `out` with log-sum-exp `lse`. ACCUMULATES: dq += ..., dk += ...,
// dv += ... (callers zero them first), so one output's gradient can be
// gathered from several key blocks and one key block's gradient from several
// query blocks. The probabilities are recomputed as exp(score - lse), so with
// the merged lse of a ring the result is the exact global gradient.
void attention_backward(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv);

// Merges the partial attention (out_b, lse_b) of one key set into the running
// (out, lse) of the keys seen so far, over n_rows rows of width D (one row =
// one query token and head; lse has one entry per row):
//   out <- out - sigmoid(lse_b - lse) * (out - out_b)
//   lse <- lse - log sigmoid(lse - lse_b)        (= logaddexp(lse, lse_b))
// in fp32, with lse = -inf rows (no key seen yet / in this block) handled
// without NaN.
void merge_partial_attention(const Ctx& ctx, int64_t n_rows, int D, float* out, float* lse,
                             const float* out_b, const float* lse_b);

}  // namespace trident::kernels
