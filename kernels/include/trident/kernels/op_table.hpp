// The op table: one row per (op, device type, dtype), the kernel that runs an
// op of functional.hpp there. The functional entry checks shapes, packs its
// tensors and scalars into an OpCall and calls run_op; run_op finds the row
// for ctx.device and the call's dtype and runs it. A missing row is an Error
// naming the op, the device and the dtype: nothing is chosen by hand per op.
//
// Rows (kernels/api/op_table.cpp assembles them):
//   cpu  f32   the CPU kernels (kernels/cpu), one row per op
//   cpu  bf16  staged: every bf16 tensor widened to f32, the f32 row, the
//              outputs rounded back to nearest even (op_list.inc's roles say
//              which tensors are read and which written)
//   cuda f32   the CUDA kernels (kernels/cuda)
//   cuda bf16  kernels/cuda/op_rows.cpp: native bf16 kernels where they
//              exist (cuda_rows.inc), staged for the others
// The emulated device runs the cpu rows with its guard lifted.
//
// The call's dtype is f32 when every float tensor is f32, else the dtype of
// the first float tensor that is not (so a bf16 tensor anywhere picks the
// bf16 row, which stages what its kernel does not take natively); a call
// with a packed weight (OpCall::packed, one with forms) is bf16: the packed
// form is the weight rounded to bf16.
//
// Internal to kernels/ (and its tests): model and parallel code call
// functional.hpp.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/types/router.hpp"

namespace trident::kernels {

class PackedBf16Weight;  // types/gemm_bf16.hpp

enum class Op : uint8_t {
#define TRIDENT_OP(name, roles, names, ...) name,
#include "trident/kernels/op_list.inc"
#undef TRIDENT_OP
  count
};

const char* op_name(Op op);
// One role letter per tensor argument (op_list.inc).
const char* op_roles(Op op);
// The name of tensor argument i (op_list.inc), for messages.
std::string op_arg_name(Op op, int i);

// One call of an op: its tensors in functional.hpp's order and the values
// the functional entry derived or was given.
struct OpCall {
  Op op{};
  std::array<Tensor, 11> t{};
  std::array<int64_t, 3> n{};   // sizes (T, in, out; T, d; T, H, D; ...)
  float f = 0.0f;               // the scalar (eps, beta, scale, value)
  const void* param = nullptr;  // the parameter struct (AttnShape, RopeFreqs, AdamWArgs, ...)
  double result = 0.0;          // what the op returns (cross_entropy, sum_squares)
  // The packed forms of the call's weights (linear: w; SwiGLU: w_gate, w_up,
  // w_down), each that weight's own (functional.cpp checks it) or null: the
  // CPU's native bf16 rows read them, every other row ignores them.
  std::array<const PackedBf16Weight*, 3> packed{};

  // Tensor i's elements (nullptr when it is empty).
  float* f32(int i) const { return t[size_t(i)].numel() ? t[size_t(i)].data<float>() : nullptr; }
  template <class T>
  T* index(int i) const {
    return t[size_t(i)].numel() ? t[size_t(i)].data<T>() : nullptr;
  }
  template <class P>
  const P& par() const {
    return *static_cast<const P*>(param);
  }
};

using OpKernel = void (*)(const Ctx& ctx, OpCall& call);

struct OpRow {
  Op op;
  DeviceType device;
  DType dtype;
  OpKernel kernel;
};

// Every row, cpu rows first (the order is the table's, not a priority).
std::span<const OpRow> op_rows();

// The dtype that picks call's row (see the file comment).
DType call_dtype(const OpCall& call);

// Runs call.op on ctx.device with the row for call_dtype(call).
void run_op(const Ctx& ctx, OpCall& call);

// The staged row's body: widens call's bf16 tensors, runs the f32 row of
// call.op on ctx.device, narrows the written ones (so a throwing kernel
// leaves bf16 outputs unwritten).
void run_staged(const Ctx& ctx, OpCall& call);

// adamw_step's scalars (OpCall::param).
struct AdamWArgs {
  const struct AdamWHyper* h;
  int64_t step;
  float grad_scale;
  bool decay;
};

// The router ops' shape and loss coefficients (OpCall::param).
struct RouterArgs {
  RouterDims dims;
  double aux_coef = 0, z_coef = 0;
};

}  // namespace trident::kernels
