// Linear layer kernels (W stored [out, in]) on top of sgemm, plus the buffer
// ops (add, copy, fill, sum of squares: in double, in vector_math.hpp's fixed
// eight-lane order).
#include <algorithm>

#include "trident/kernels/backends.hpp"
#include "vector_math.hpp"

namespace trident::kernels::cpu {

void linear_forward(const Ctx& ctx, const float* x, const float* w, int64_t T, int64_t in,
                    int64_t out, float* y) {
  cpu::sgemm(ctx, false, true, T, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void linear_backward_input(const Ctx& ctx, const float* dy, const float* w, int64_t T, int64_t in,
                           int64_t out, float* dx, float beta) {
  cpu::sgemm(ctx, false, false, T, in, out, 1.0f, dy, out, w, in, beta, dx, in);
}

void linear_backward_weight(const Ctx& ctx, const float* dy, const float* x, int64_t T, int64_t in,
                            int64_t out, float* dw) {
  if (T == 0) return;
  cpu::sgemm(ctx, true, false, out, in, T, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

void add_inplace(const Ctx& ctx, float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void copy(const Ctx& ctx, float* dst, const float* src, int64_t n) { std::copy_n(src, n, dst); }

void fill(const Ctx& ctx, float* x, int64_t n, float value) { std::fill_n(x, n, value); }

double sum_squares(const Ctx& ctx, const float* x, int64_t n) { return sum_squares_d(x, n); }

}  // namespace trident::kernels::cpu
