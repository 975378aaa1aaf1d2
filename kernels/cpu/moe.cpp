// MoE token kernels on the CPU: the permutation of rows before dispatch and
// the weighted un-permute (combine), with their backward passes.
#include <cstring>

#include "trident/kernels/moe_backends.hpp"
#include "vector_math.hpp"

namespace trident::kernels::cpu {
namespace {

// y[t] = sum over kept slots j of w[t*k + j] * rows[row[t*k + j]] (w
// nullptr: 1), slots in order; the combine and the permute's backward.
void weighted_sum(const RowSource& rows, int64_t d, const int64_t* row, const float* weight,
                  int64_t T, int k, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    float* yt = y + t * d;
    std::fill(yt, yt + d, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      if (r < 0) continue;
      const float wj = weight ? weight[t * k + j] : 1.0f;
      const float* src = rows.row(r, d);
      for (int64_t c = 0; c < d; ++c) yt[c] += wj * src[c];
    }
  }
}

}  // namespace

void gather_rows(const Ctx&, const float* x, int64_t d, const int64_t* src_row, int64_t n,
                 float* out) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * d, x + src_row[i] * d, sizeof(float) * static_cast<size_t>(d));
}

void combine_rows(const Ctx&, const RowSource& rows, int64_t d, const int64_t* row,
                  const float* weight, int64_t T, int k, float* y) {
  weighted_sum(rows, d, row, weight, T, k, y);
}

void combine_rows_backward(const Ctx&, const RowSource& rows, const float* dy, int64_t d,
                           const int64_t* row, const float* weight, int64_t T, int k, float* drows,
                           float* dweight) {
  for (int64_t t = 0; t < T; ++t) {
    const float* dyt = dy + t * d;
    for (int j = 0; j < k; ++j) {
      const int64_t i = t * k + j, r = row[i];
      if (r < 0) {
        dweight[i] = 0.0f;
        continue;
      }
      float* dst = drows + r * d;
      const float wi = weight[i];
      for (int64_t c = 0; c < d; ++c) dst[c] = wi * dyt[c];
      dweight[i] = static_cast<float>(dot_d(dyt, rows.row(r, d), d));
    }
  }
}

void scatter_add_rows(const Ctx&, const float* drows, int64_t d, const int64_t* row, int64_t T,
                      int k, float* dx) {
  weighted_sum(RowSource(drows), d, row, nullptr, T, k, dx);
}

}  // namespace trident::kernels::cpu
