// The CUDA backend's native bf16 rows of the op table (cuda_rows.inc): the
// GEMMs whose two operands are bf16 (cuBLAS with fp32 accumulation, the
// output f32, or bf16 rounded to nearest even) and attention on bf16 q, k,
// v, out (and dout) with fp32 lse and gradients: the same arithmetic on the
// same bf16 operands as the staged CPU reference, in another summation order.
// A call whose operands do not match the kernel's signature (a mixed f32 and
// bf16 pair) runs the staged row instead.
#include "trident/kernels/cuda/op_rows.hpp"

#include <initializer_list>

#include "trident/kernels/attention.hpp"
#include "trident/kernels/cuda/ops.hpp"

namespace trident::kernels::cuda {
namespace {

// Whether call's tensors `bf16` are nonempty bf16 and its tensors `f32` are
// f32: the native kernel's signature.
bool fits(const OpCall& c, std::initializer_list<int> bf16, std::initializer_list<int> f32 = {}) {
  for (int i : bf16)
    if (c.t[size_t(i)].dtype() != DType::bf16 || c.t[size_t(i)].numel() == 0) return false;
  for (int i : f32)
    if (c.t[size_t(i)].dtype() != DType::f32) return false;
  return true;
}

const Bf16* bf(const OpCall& c, int i) {
  return reinterpret_cast<const Bf16*>(c.t[size_t(i)].data<uint16_t>());
}
Bf16* bf_out(const OpCall& c, int i) {
  return reinterpret_cast<Bf16*>(c.t[size_t(i)].data<uint16_t>());
}

void linear_forward_bf16_row(const Ctx& ctx, OpCall& c) {  // y = x w^T
  if (!fits(c, {0, 1})) return run_staged(ctx, c);
  const int64_t T = c.n[0], in = c.n[1], out = c.n[2];
  if (c.t[2].dtype() == DType::f32)
    gemm_bf16(ctx, false, true, T, out, in, 1.0f, bf(c, 0), in, bf(c, 1), in, 0.0f, c.f32(2), out);
  else
    gemm_bf16_out(ctx, false, true, T, out, in, 1.0f, bf(c, 0), in, bf(c, 1), in, 0.0f,
                  bf_out(c, 2), out);
}

void linear_backward_input_bf16_row(const Ctx& ctx, OpCall& c) {  // dx = dy w + beta dx
  if (!fits(c, {0, 1}, {2})) return run_staged(ctx, c);
  const int64_t T = c.n[0], in = c.n[1], out = c.n[2];
  gemm_bf16(ctx, false, false, T, in, out, 1.0f, bf(c, 0), out, bf(c, 1), in, c.f, c.f32(2), in);
}

void linear_backward_weight_bf16_row(const Ctx& ctx, OpCall& c) {  // dw += dy^T x
  if (!fits(c, {0, 1}, {2})) return run_staged(ctx, c);
  const int64_t T = c.n[0], in = c.n[1], out = c.n[2];
  gemm_bf16(ctx, true, false, out, in, T, 1.0f, bf(c, 0), out, bf(c, 1), in, 1.0f, c.f32(2), in);
}

void attention_forward_bf16_row(const Ctx& ctx, OpCall& c) {
  if (!fits(c, {0, 1, 2, 3}, {4})) return run_staged(ctx, c);
  attention_forward_bf16(ctx, c.par<AttnShape>(), bf(c, 0), bf(c, 1), bf(c, 2), bf_out(c, 3),
                         c.f32(4));
}

void attention_backward_bf16_row(const Ctx& ctx, OpCall& c) {
  if (!fits(c, {0, 1, 2, 3, 5}, {4, 6, 7, 8})) return run_staged(ctx, c);
  attention_backward_bf16(ctx, c.par<AttnShape>(), bf(c, 0), bf(c, 1), bf(c, 2), bf(c, 3), c.f32(4),
                          bf(c, 5), c.f32(6), c.f32(7), c.f32(8));
}

#define TRIDENT_CUDA_ROW(op, dtype, test) \
  {Op::op, DeviceType::cuda, DType::dtype, &op##_##dtype##_row},
constexpr OpRow kRows[] = {
#include "trident/kernels/cuda_rows.inc"
};
#undef TRIDENT_CUDA_ROW

}  // namespace

std::span<const OpRow> bf16_rows() { return kRows; }

}  // namespace trident::kernels::cuda
