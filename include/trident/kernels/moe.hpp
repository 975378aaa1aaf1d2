// Token-level MoE kernels: top-k selection, the expert-major permutation of
// token rows and its weighted inverse. Row-major fp32, d floats per row.
//
// Every loop runs in a fixed order (tokens ascending, then the k slots), so
// results do not depend on how experts are spread over ranks.
#pragma once
#include <cstdint>

namespace trident::kernels {

// For each of T rows of `scores` [T, E], the k largest entries, best first;
// ties go to the lower expert index. idx [T, k].
void topk_rows(const float* scores, int64_t T, int E, int k, int* idx);

// out[i, :] = x[src_row[i], :] for i < n (the permutation before dispatch).
void gather_rows(const float* x, int64_t d, const int64_t* src_row, int64_t n, float* out);

// The combine: for each token t and slot j < k with row[t*k + j] >= 0,
// y[t, :] += weight[t*k + j] * rows[row[t*k + j], :], slots in order. y is
// overwritten first (a token with every copy dropped gets zeros).
void combine_rows(const float* rows, int64_t d, const int64_t* row, const float* weight, int64_t T,
                  int k, float* y);

// One token of the combine: y[:] = sum over j < k, in order, of
// w[j] * rows[j][:] (rows[j] nullptr: a dropped copy; w nullptr: weights 1).
void combine_row(const float* const* rows, const float* w, int k, int64_t d, float* y);

// One token of the backward: for each copy j with row[j] >= 0,
// drows[row[j], :] = w[j] * dy[:] and dweight[j] = <dy, rows[j]> (else 0).
void combine_row_backward(const float* const* rows, const float* dy, int64_t d, const int64_t* row,
                          const float* w, int k, float* drows, float* dweight);

// Backward of combine_rows: drows[row] = weight * dy[t] and
// dweight[t*k + j] = <dy[t], rows[row]> (0 for dropped copies).
void combine_rows_backward(const float* rows, const float* dy, int64_t d, const int64_t* row,
                           const float* weight, int64_t T, int k, float* drows, float* dweight);

// Backward of the gather (scatter-add over the k copies): dx[t] = sum over
// slots j of drows[row[t*k + j]], slots in order; dx is overwritten.
void scatter_add_rows(const float* drows, int64_t d, const int64_t* row, int64_t T, int k,
                      float* dx);

}  // namespace trident::kernels
