// The op table (op_table.hpp): its rows, the lookup on (op, device, dtype)
// and the staged bf16 row shared by every op without a native one.
#include "trident/kernels/op_table.hpp"

#include <string>
#include <vector>

#include "trident/core/emulated.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/cpu_bf16.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/moe_backends.hpp"
#include "trident/kernels/router.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/kernels/types/gemm_bf16.hpp"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/op_rows.hpp"
#endif

namespace trident::kernels {
namespace {

// What the row bodies of op_list.inc share: combine_rows's source, the
// RowSource the functional entry described (OpCall::param) or else tensor 0
// (possibly staged); the router's loss terms from tensors i, i + 1, i + 2
// (sample, f, inv_tokens) and the call's RouterArgs.
RowSource row_source(const OpCall& a) { return a.param ? a.par<RowSource>() : RowSource(a.f32(0)); }
RouterLossTerms loss_terms(const OpCall& a, int i) {
  const auto& p = a.par<RouterArgs>();
  return {a.index<int32_t>(i), a.index<double>(i + 1), a.index<double>(i + 2), p.aux_coef,
          p.z_coef};
}

// The f32 rows of one backend: op_list.inc's row bodies, with `be` naming
// the backend.
#define TRIDENT_OP(name, roles, names, gpu_test, ...) \
  void name(const Ctx& c, OpCall& a) { __VA_ARGS__ }

namespace cpu_rows {
namespace be = ::trident::kernels::cpu;
#include "trident/kernels/op_list.inc"
}  // namespace cpu_rows

#ifdef TRIDENT_HAVE_CUDA
namespace cuda_rows {
namespace be = ::trident::kernels::cuda;
#include "trident/kernels/op_list.inc"
}  // namespace cuda_rows
#endif
#undef TRIDENT_OP

// The f32 rows of one backend, one per op, in op_list.inc's order.
#define TRIDENT_OP(name, roles, names, ...) {Op::name, DEVICE, DType::f32, &NS::name},
#define DEVICE DeviceType::cpu
#define NS cpu_rows
constexpr OpRow kCpuF32[] = {
#include "trident/kernels/op_list.inc"
};
#undef DEVICE
#undef NS
#ifdef TRIDENT_HAVE_CUDA
#define DEVICE DeviceType::cuda
#define NS cuda_rows
constexpr OpRow kCudaF32[] = {
#include "trident/kernels/op_list.inc"
};
#undef DEVICE
#undef NS
#endif
#undef TRIDENT_OP

std::vector<OpRow> assemble() {
  std::vector<OpRow> rows(std::begin(kCpuF32), std::end(kCpuF32));
  // the CPU's native bf16 rows (they run the staged row themselves when
  // native bf16 is off: cpu_bf16.hpp), the staged row for every other op
  const auto cpu_native = cpu::bf16_rows();
  rows.insert(rows.end(), cpu_native.begin(), cpu_native.end());
  for (const OpRow& r : kCpuF32) {
    bool has_native = false;
    for (const OpRow& n : cpu_native) has_native = has_native || n.op == r.op;
    if (!has_native) rows.push_back({r.op, DeviceType::cpu, DType::bf16, &run_staged});
  }
#ifdef TRIDENT_HAVE_CUDA
  rows.insert(rows.end(), std::begin(kCudaF32), std::end(kCudaF32));
  const auto native = cuda::bf16_rows();
  rows.insert(rows.end(), native.begin(), native.end());
  for (const OpRow& r : kCudaF32) {
    bool has_native = false;
    for (const OpRow& n : native) has_native = has_native || n.op == r.op;
    if (!has_native) rows.push_back({r.op, DeviceType::cuda, DType::bf16, &run_staged});
  }
#endif
  return rows;
}

const std::vector<OpRow>& table() {
  static const std::vector<OpRow> rows = assemble();
  return rows;
}

const OpRow* find(Op op, DeviceType device, DType dtype) {
  for (const OpRow& r : table())
    if (r.op == op && r.device == device && r.dtype == dtype) return &r;
  return nullptr;
}

const OpRow& row_for(Op op, Device device, DType dtype) {
  const DeviceType type = device.is_emulated() ? DeviceType::cpu : device.type;
  const OpRow* r = find(op, type, dtype);
  TRIDENT_CHECK(r != nullptr, std::string("kernels::") + op_name(op) + ": no kernel for device " +
                                  device.str() + " and dtype " + dtype_name(dtype) +
                                  " (op table, kernels/api/op_table.cpp)");
  return *r;
}

// On the emulated device a kernel runs with the device's guard lifted; the
// staged row does not (it allocates, and its conversions and its f32 row
// each lift the guard themselves).
void run_row(const Ctx& ctx, const OpRow& r, OpCall& call) {
  if (ctx.device.is_emulated() && r.kernel != &run_staged) {
    const emulated::Guard lifted;
    r.kernel(ctx, call);
    return;
  }
  r.kernel(ctx, call);
}

bool is_float_role(char role) { return role != 'x'; }

bool writes(char role) { return role == 'o' || role == 'u' || role == '?' || role == 'b'; }
bool reads(char role, const OpCall& call) {
  return role == 'i' || role == 'u' || role == '?' || (role == 'b' && call.f != 0.0f);
}

}  // namespace

const char* op_name(Op op) {
  static constexpr const char* names[] = {
#define TRIDENT_OP(name, roles, names, ...) #name,
#include "trident/kernels/op_list.inc"
#undef TRIDENT_OP
  };
  return names[size_t(op)];
}

const char* op_roles(Op op) {
  static constexpr const char* roles_of[] = {
#define TRIDENT_OP(name, roles, names, ...) roles,
#include "trident/kernels/op_list.inc"
#undef TRIDENT_OP
  };
  return roles_of[size_t(op)];
}

std::string op_arg_name(Op op, int i) {
  static constexpr const char* names_of[] = {
#define TRIDENT_OP(name, roles, names, ...) names,
#include "trident/kernels/op_list.inc"
#undef TRIDENT_OP
  };
  std::string names = names_of[size_t(op)];
  size_t begin = 0;
  for (int k = 0; k < i && begin != std::string::npos; ++k) {
    begin = names.find(' ', begin);
    if (begin != std::string::npos) ++begin;
  }
  if (begin == std::string::npos) return "tensor " + std::to_string(i);
  return names.substr(begin, names.find(' ', begin) - begin);
}

std::span<const OpRow> op_rows() { return table(); }

DType call_dtype(const OpCall& call) {
  for (const PackedBf16Weight* w : call.packed)
    if (w != nullptr && w->has_forms()) return DType::bf16;
  const char* roles = op_roles(call.op);
  for (size_t i = 0; roles[i]; ++i) {
    const Tensor& t = call.t[i];
    if (is_float_role(roles[i]) && t.numel() && t.dtype() != DType::f32) return t.dtype();
  }
  return DType::f32;
}

void run_op(const Ctx& ctx, OpCall& call) {
  run_row(ctx, row_for(call.op, ctx.device, call_dtype(call)), call);
}

void run_staged(const Ctx& ctx, OpCall& call) {
  const char* roles = op_roles(call.op);
  OpCall wide = call;
  std::vector<size_t> written;
  for (size_t i = 0; roles[i]; ++i) {
    const Tensor& t = call.t[i];
    if (!is_float_role(roles[i]) || t.dtype() == DType::f32) continue;
    if (roles[i] == '?' && t.numel() == 0) continue;
    TRIDENT_CHECK(t.dtype() == DType::bf16, std::string("kernels::") + op_name(call.op) + ": " +
                                                op_arg_name(call.op, int(i)) + " " + t.shape_str() +
                                                " " + dtype_name(t.dtype()) +
                                                " cannot be staged to f32");
    wide.t[i] = empty(ctx, t.shape(), DType::f32);
    if (reads(roles[i], call)) convert(ctx, t, wide.t[i]);
    if (writes(roles[i])) written.push_back(i);
  }
  run_row(ctx, row_for(call.op, ctx.device, DType::f32), wide);
  for (size_t i : written) convert(ctx, wide.t[i], call.t[i]);
  call.result = wide.result;
}

}  // namespace trident::kernels
