// MoE token kernels on the CPU: top-k, permutation of rows before dispatch,
// and the weighted un-permute (combine) with their backward passes.
#include "trident/kernels/moe.hpp"

#include <algorithm>
#include <cstring>

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

void combine_rows(const float* rows, int64_t d, const int64_t* row, const float* weight,
                  int64_t T, int k, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    float* yt = y + t * d;
    std::fill(yt, yt + d, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      if (r < 0) continue;
      const float w = weight[t * k + j];
      const float* src = rows + r * d;
      for (int64_t c = 0; c < d; ++c) yt[c] += w * src[c];
    }
  }
}

void combine_rows_backward(const float* rows, const float* dy, int64_t d, const int64_t* row,
                           const float* weight, int64_t T, int k, float* drows, float* dweight) {
  for (int64_t t = 0; t < T; ++t) {
    const float* g = dy + t * d;
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      if (r < 0) {
        dweight[t * k + j] = 0.0f;
        continue;
      }
      const float w = weight[t * k + j];
      const float* src = rows + r * d;
      float* dst = drows + r * d;
      double dot = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        dot += double(g[c]) * double(src[c]);
        dst[c] = w * g[c];
      }
      dweight[t * k + j] = static_cast<float>(dot);
    }
  }
}

void scatter_add_rows(const float* drows, int64_t d, const int64_t* row, int64_t T, int k,
                      float* dx) {
  for (int64_t t = 0; t < T; ++t) {
    float* out = dx + t * d;
    std::fill(out, out + d, 0.0f);
    for (int j = 0; j < k; ++j) {
      const int64_t r = row[t * k + j];
      if (r < 0) continue;
      const float* src = drows + r * d;
      for (int64_t c = 0; c < d; ++c) out[c] += src[c];
    }
  }
}

}  // namespace trident::kernels
