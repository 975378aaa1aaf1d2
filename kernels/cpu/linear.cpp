// Linear layer kernels (W stored [out, in]) on top of sgemm and gemm_direct,
// plus the buffer ops (add, copy, fill, sum of squares: in double, in
// vector_math.hpp's fixed eight-lane order).
#include <algorithm>

#include "gemm_direct.hpp"
#include "host_params.hpp"
#include "trident/kernels/backends.hpp"
#include "vector_math.hpp"

namespace trident::kernels::cpu {
namespace {

// The backward's two GEMMs already have gemm_direct's form (B read by rows:
// W for dx = dy·W, x for dW += dyᵀ·x), so they need no packing at all. It
// is faster than OpenBLAS while both operands fit the second-level cache
// (an MoE expert's rows, the attention projections of one micro-batch) and
// slower beyond (it does not block K or N), where OpenBLAS keeps the call.
// The forward (y = x·Wᵀ) goes through gemm_direct_nt under the same bound:
// it transposes W 32 rows at a time into a panel that the row tiles read
// from the first-level cache, and asks for the next 32 rows meanwhile. In
// the benchmark model's step its GEMMs ran at 1.03x OpenBLAS's rate (whose
// packing reads the same cold weights; cpu-2026-12-04-zen5.md).
// The bound is the host's (GemmParams::direct: its L2, 1 MiB per operand on
// Zen 4 and Zen 5; host_params.hpp).
bool direct_fits(int64_t a_floats, int64_t b_floats) {
  const int64_t max_floats = gemm_params().direct_bytes / int64_t(sizeof(float));
  return gemm_direct_native() && a_floats <= max_floats && b_floats <= max_floats;
}

}  // namespace

void linear_forward(const Ctx& ctx, const float* x, const float* w, int64_t T, int64_t in,
                    int64_t out, float* y) {
  if (direct_fits(T * in, out * in))
    gemm_direct_nt(ctx, T, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  else
    cpu::sgemm(ctx, false, true, T, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void linear_backward_input(const Ctx& ctx, const float* dy, const float* w, int64_t T, int64_t in,
                           int64_t out, float* dx, float beta) {
  if (direct_fits(T * out, out * in))
    gemm_direct(ctx, false, T, in, out, 1.0f, dy, out, w, in, beta, dx, in);
  else
    cpu::sgemm(ctx, false, false, T, in, out, 1.0f, dy, out, w, in, beta, dx, in);
}

void linear_backward_weight(const Ctx& ctx, const float* dy, const float* x, int64_t T, int64_t in,
                            int64_t out, float* dw) {
  if (T == 0) return;
  if (direct_fits(T * out, T * in))
    gemm_direct(ctx, true, out, in, T, 1.0f, dy, out, x, in, 1.0f, dw, in);
  else
    cpu::sgemm(ctx, true, false, out, in, T, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

void add_inplace(const Ctx& ctx, float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void copy(const Ctx& ctx, float* dst, const float* src, int64_t n) { std::copy_n(src, n, dst); }

void fill(const Ctx& ctx, float* x, int64_t n, float value) { std::fill_n(x, n, value); }

double sum_squares(const Ctx& ctx, const float* x, int64_t n) { return sum_squares_d(x, n); }

void sum_squares_ranges(const Ctx& ctx, const float* x, const int64_t* ranges, int64_t count,
                        double* sums) {
  for (int64_t k = 0; k < count; ++k)
    sums[k] = sum_squares_d(x + ranges[2 * k], ranges[2 * k + 1] - ranges[2 * k]);
}

}  // namespace trident::kernels::cpu
