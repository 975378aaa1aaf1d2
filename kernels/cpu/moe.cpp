// MoE token kernels on the CPU: top-k, permutation of rows before dispatch,
// and the weighted un-permute (combine) with their backward passes.
#include "trident/kernels/moe.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace trident::kernels {

void topk_rows(const float* scores, int64_t T, int E, int k, int* idx) {
  for (int64_t t = 0; t < T; ++t) {
    const float* s = scores + t * E;
    int* out = idx + t * k;
    // Insertion into a k-long sorted list: k is small (1..8), E modest.
    int n = 0;
    for (int e = 0; e < E; ++e) {
      int pos = n;
      while (pos > 0 && s[e] > s[out[pos - 1]]) --pos;  // strict: ties keep the lower index
      if (pos >= k) continue;
      for (int m = std::min(n, k - 1); m > pos; --m) out[m] = out[m - 1];
      out[pos] = e;
      if (n < k) ++n;
    }
  }
}

void gather_rows(const float* x, int64_t d, const int64_t* src_row, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out + i * d, x + src_row[i] * d, sizeof(float) * static_cast<size_t>(d));
}

void combine_row(const float* const* rows, const float* w, int k, int64_t d, float* y) {
  std::fill(y, y + d, 0.0f);
  for (int j = 0; j < k; ++j) {
    if (!rows[j]) continue;
    const float wj = w ? w[j] : 1.0f;
    const float* src = rows[j];
    for (int64_t c = 0; c < d; ++c) y[c] += wj * src[c];
  }
}

void combine_row_backward(const float* const* rows, const float* dy, int64_t d, const int64_t* row,
                          const float* w, int k, float* drows, float* dweight) {
  for (int j = 0; j < k; ++j) {
    if (row[j] < 0) {
      dweight[j] = 0.0f;
      continue;
    }
    const float* src = rows[j];
    float* dst = drows + row[j] * d;
    double dot = 0.0;
    for (int64_t c = 0; c < d; ++c) {
      dot += double(dy[c]) * double(src[c]);
      dst[c] = w[j] * dy[c];
    }
    dweight[j] = static_cast<float>(dot);
  }
}

namespace {
// The k rows of token t's copies inside a [S, d] array in send order.
void rows_of_token(const float* rows, int64_t d, const int64_t* row, int k, const float** out) {
  for (int j = 0; j < k; ++j) out[j] = row[j] < 0 ? nullptr : rows + row[j] * d;
}
}  // namespace

void combine_rows(const float* rows, int64_t d, const int64_t* row, const float* weight, int64_t T,
                  int k, float* y) {
  std::vector<const float*> ptr(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    rows_of_token(rows, d, row + t * k, k, ptr.data());
    combine_row(ptr.data(), weight + t * k, k, d, y + t * d);
  }
}

void combine_rows_backward(const float* rows, const float* dy, int64_t d, const int64_t* row,
                           const float* weight, int64_t T, int k, float* drows, float* dweight) {
  std::vector<const float*> ptr(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    rows_of_token(rows, d, row + t * k, k, ptr.data());
    combine_row_backward(ptr.data(), dy + t * d, d, row + t * k, weight + t * k, k, drows,
                         dweight + t * k);
  }
}

void scatter_add_rows(const float* drows, int64_t d, const int64_t* row, int64_t T, int k,
                      float* dx) {
  std::vector<const float*> ptr(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    rows_of_token(drows, d, row + t * k, k, ptr.data());
    combine_row(ptr.data(), nullptr, k, d, dx + t * d);
  }
}

}  // namespace trident::kernels
