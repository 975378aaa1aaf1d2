// Token-level MoE kernels: the permutation of token rows into expert order
// (permute, before dispatch) and its weighted inverse (unpermute, the
// combine), with their backward passes. Row-major fp32, d floats per row.
//
// Both directions are driven by an index plan computed once per routing
// (ep::DispatchPlan): src_row [n] names the token of each permuted row, and
// row [T*k] names the permuted row of each copy (t, j) (-1: dropped). A
// kernel is then one gather or scatter pass, with no per-token callback,
// so that a device backend can run it as one launch.
//
// Every loop runs in a fixed order (tokens ascending, then the k slots), so
// results do not depend on how experts are spread over ranks.
#pragma once
#include <cstdint>

#include "trident/kernels/context.hpp"
#include "trident/kernels/types/row_source.hpp"

namespace trident::kernels {

// RowSource (permuted rows in one buffer or in segments):
// kernels/types/row_source.hpp.

// Permute: out[i, :] = x[src_row[i], :] for i < n.
void gather_rows(const Ctx& ctx, const float* x, int64_t d, const int64_t* src_row, int64_t n,
                 float* out);

// Unpermute (the combine): y[t, :] = sum over slots j < k with
// row[t*k + j] >= 0, in order, of weight[t*k + j] * rows[row[t*k + j], :]
// (weight nullptr: 1). y is overwritten (a token with every copy dropped
// gets zeros).
void combine_rows(const Ctx& ctx, const RowSource& rows, int64_t d, const int64_t* row,
                  const float* weight, int64_t T, int k, float* y);

// Backward of combine_rows: drows[row] = weight * dy[t] and
// dweight[t*k + j] = <dy[t], rows[row]> (0 for dropped copies). drows [S, d]
// is written only at the rows of kept copies.
void combine_rows_backward(const Ctx& ctx, const RowSource& rows, const float* dy, int64_t d,
                           const int64_t* row, const float* weight, int64_t T, int k, float* drows,
                           float* dweight);

// The dispatch plan's index data, from the routed experts expert [n] of the
// n = T*k copies (-1: dropped). counts [E] (i64), overwritten: the copies
// per expert; the one small copy a plan brings to the host, to size the
// messages. Ids outside [-1, E) are an error on the host backends.
void expert_counts(const Ctx& ctx, const int* expert, int64_t n, int E, int64_t* counts);
// The stable expert-major order of the copies, from counts [E]: expert e's
// rows start after the rows of experts < e, in copy order within one.
// row_of [n]: each copy's row (-1 dropped); send_token [sum counts]: each
// row's token (copy / k).
void expert_order(const Ctx& ctx, const int* expert, int64_t n, int k, int E, const int64_t* counts,
                  int64_t* row_of, int64_t* send_token);

// Backward of the permute (scatter-add over the k copies): dx[t] = sum
// over slots j of drows[row[t*k + j]], slots in order; dx is overwritten.
void scatter_add_rows(const Ctx& ctx, const float* drows, int64_t d, const int64_t* row, int64_t T,
                      int k, float* dx);

}  // namespace trident::kernels
