// MoE token kernels on the CPU: the permutation of rows before dispatch and
// the weighted un-permute (combine), with their backward passes.
#include <cstring>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/kernels/moe_backends.hpp"
#include "vector_math.hpp"

namespace trident::kernels::cpu {
namespace {

// y[0:d] += w * x[0:d] and y[0:d] = w * x[0:d], one multiply and one add an
// element in every variant (vector_math.hpp: no FMA), so the bits of the
// scalar loops; x and y do not overlap.
TRIDENT_CPU_CLONES void add_scaled(float w, const float* x, int64_t d, float* y) {
  TRIDENT_SIMD
  for (int64_t c = 0; c < d; ++c) y[c] += w * x[c];
}
TRIDENT_CPU_CLONES void scaled(float w, const float* x, int64_t d, float* y) {
  TRIDENT_SIMD
  for (int64_t c = 0; c < d; ++c) y[c] = w * x[c];
}
// y[0:d] = 0 + w * x[0:d]: the bits of zero-filling y and adding w * x to
// it (0 + -0 is +0, so the explicit zero is kept), in one pass over y.
TRIDENT_CPU_CLONES void first_scaled(float w, const float* x, int64_t d, float* y) {
  TRIDENT_SIMD
  for (int64_t c = 0; c < d; ++c) y[c] = 0.0f + w * x[c];
}

// y[t] = sum over kept slots j of w[t*k + j] * rows[row[t*k + j]] (w
// nullptr: 1), slots in order from a zero row; the combine and the
// permute's backward. The first kept slot writes the row (first_scaled:
// the zero's bits without a pass that writes it), a token with none is
// zero-filled.
void weighted_sum(const RowSource& rows, int64_t d, const int64_t* row, const float* weight,
                  int64_t T, int k, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    float* yt = y + t * d;
    bool written = false;
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      if (r < 0) continue;
      const float wj = weight ? weight[t * k + j] : 1.0f;
      if (written) {
        add_scaled(wj, rows.row(r, d), d, yt);
      } else {
        first_scaled(wj, rows.row(r, d), d, yt);
        written = true;
      }
    }
    if (!written) std::fill(yt, yt + d, 0.0f);
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
      scaled(weight[i], dyt, d, drows + r * d);
      dweight[i] = static_cast<float>(dot_d(dyt, rows.row(r, d), d));
    }
  }
}

void scatter_add_rows(const Ctx&, const float* drows, int64_t d, const int64_t* row, int64_t T,
                      int k, float* dx) {
  weighted_sum(RowSource(drows), d, row, nullptr, T, k, dx);
}

void expert_counts(const Ctx&, const int* expert, int64_t n, int E, int64_t* counts) {
  std::fill(counts, counts + E, int64_t{0});
  for (int64_t i = 0; i < n; ++i) {
    const int e = expert[i];
    if (e < 0) continue;
    TRIDENT_CHECK(e < E, "expert id " + std::to_string(e) + " out of range");
    counts[e]++;
  }
}

void expert_order(const Ctx&, const int* expert, int64_t n, int k, int E, const int64_t* counts,
                  int64_t* row_of, int64_t* send_token) {
  std::vector<int64_t> next(size_t(E), 0);
  for (int e = 1; e < E; ++e) next[size_t(e)] = next[size_t(e) - 1] + counts[e - 1];
  for (int64_t i = 0; i < n; ++i) {
    const int e = expert[i];
    if (e < 0) {
      row_of[i] = -1;
      continue;
    }
    const int64_t r = next[size_t(e)]++;
    row_of[i] = r;
    send_token[r] = i / k;
  }
}

}  // namespace trident::kernels::cpu
