// Linear layer kernels (W stored [out, in]) on top of sgemm, plus the tiny
// vector helpers the training loop shares.
#include "trident/kernels/gemm.hpp"
#include "trident/kernels/ops.hpp"

namespace trident::kernels {

void linear_forward(const float* x, const float* w, int64_t T, int64_t in, int64_t out, float* y) {
  sgemm(false, true, T, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void linear_backward_input(const float* dy, const float* w, int64_t T, int64_t in, int64_t out,
                           float* dx, float beta) {
  sgemm(false, false, T, in, out, 1.0f, dy, out, w, in, beta, dx, in);
}

void linear_backward_weight(const float* dy, const float* x, int64_t T, int64_t in, int64_t out,
                            float* dw) {
  if (T == 0) return;
  sgemm(true, false, out, in, T, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

double sum_squares(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  return s;
}

}  // namespace trident::kernels
