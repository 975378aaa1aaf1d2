// The CPU's native bf16 rows of the op table and the choice between them
// and the staged row (cpu_bf16.hpp): the linear layers' three GEMMs, the
// SwiGLU FFN's six and the attention's products on AVX512-BF16 (gemm_bf16.cpp,
// swiglu_bf16.cpp, attention_bf16.cpp), and the gather of f32 rows into bf16
// ones. A call runs the staged row when
// native bf16 is off (TRIDENT_CPU_BF16=staged, or a CPU without AVX512-BF16) or its operands do not
// fit the kernel (a bf16 output that is also read, a bf16 weight gradient).
//
// An f32 operand of a bf16 call (the gradient dy beside a bf16 weight or
// activation) is rounded to bf16 as the GEMM packs it: the native GEMM
// multiplies bf16 by bf16, as PyTorch's autocast does. The staged row keeps
// it f32; both are within the bf16 tolerance of fp32 (gpu.md#bf16).
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define TRIDENT_HAVE_CPUID 1
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "trident/core/error.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/kernels/cpu_bf16.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/kernels/types/gemm_bf16.hpp"

namespace trident::kernels::cpu {
namespace {

#ifdef TRIDENT_HAVE_CPUID
bool os_saves_avx512() {  // XCR0: SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM state
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & 0xe6u) == 0xe6u;
}

Bf16Units detect() {
  Bf16Units u;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !os_saves_avx512()) return u;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return u;
  // AVX-512 F, BW and VL (the packing's 16-bit loads), as every CPU with AVX512-BF16 has
  const bool avx512f = (b & (1u << 16)) && (b & (1u << 30)) && (b & (1u << 31));
  u.avx512 = avx512f;
  u.amx_bf16 = (d & (1u << 22)) && (d & (1u << 24));  // AMX-BF16 and AMX-TILE
  // The native path's vector exp (vreduceps, vscalefps) needs AVX-512 DQ
  // too, which every CPU with AVX512-BF16 so far has: one without it takes
  // the staged path rather than failing in the attention's own check.
  const bool avx512dq = b & (1u << 17);
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return u;
  u.avx512_bf16 = avx512f && avx512dq && (a & (1u << 5));
  return u;
}
#else
Bf16Units detect() { return {}; }  // not x86-64: no AVX512-BF16
#endif

// -1: not resolved yet; else int(Bf16Mode) with automatic resolved away.
std::atomic<int> g_native{-1};
// Whether the path was chosen by kernels::set_cpu_bf16_path (named so).
std::atomic<bool> g_chosen{false};

bool resolve(Bf16Mode mode) {
  if (mode == Bf16Mode::staged) return false;
  if (mode == Bf16Mode::native && !bf16_units().avx512_bf16)
    throw InputError(
        "TRIDENT_CPU_BF16=native: this CPU has no AVX512-BF16 (vdpbf16ps); use auto or staged");
  return bf16_units().avx512_bf16;
}

// The packed forms of call c's weight k (OpCall::packed), if it has them.
Bf16PackedWeight packed_forms(const OpCall& c, int k) {
  const PackedBf16Weight* p = c.packed[size_t(k)];
  if (p == nullptr || !p->has_forms()) return {};
  return {p->nt(), p->nn()};
}

// The staged row of c, where a weight (tensors `weights`, in OpCall::packed's
// order) with a packed form is f32 rounded to bf16 first: the packed operand
// stands for the weight as rounded, as the native rows read it.
void staged(const Ctx& ctx, const OpCall& c, std::initializer_list<int> weights) {
  OpCall s = c;
  int k = 0;
  for (int i : weights) {
    const Tensor& w = c.t[size_t(i)];
    if (packed_forms(c, k++).nt == nullptr || w.dtype() != DType::f32 || w.numel() == 0) continue;
    s.t[size_t(i)] = empty(ctx, w.shape(), DType::bf16);
    cpu::to_bf16(ctx, w.data<float>(), w.numel(), s.t[size_t(i)].data<uint16_t>());
  }
  run_staged(ctx, s);
}

// Whether call's tensors `idx` are nonempty f32 or bf16 (the native GEMM
// takes either, rounding f32 when it packs).
bool dense(const OpCall& c, std::initializer_list<int> idx) {
  for (int i : idx) {
    const Tensor& t = c.t[size_t(i)];
    if (t.numel() == 0 || (t.dtype() != DType::f32 && t.dtype() != DType::bf16)) return false;
  }
  return true;
}

Bf16Operand operand(const OpCall& c, int i, bool trans, int64_t ld) {
  const Tensor& t = c.t[size_t(i)];
  const bool f32 = t.dtype() == DType::f32;
  const void* p = f32 ? static_cast<const void*>(t.data<float>())
                      : static_cast<const void*>(t.data<uint16_t>());
  return {p, f32, trans, ld};
}

void linear_forward_row(const Ctx& ctx, OpCall& c) {  // y = x wᵀ
  if (!bf16_native() || !dense(c, {0, 1, 2})) return staged(ctx, c, {1});
  const int64_t T = c.n[0], in = c.n[1], out = c.n[2];
  const Bf16Operand x = operand(c, 0, false, in);
  Bf16Operand w = operand(c, 1, true, in);
  w.packed = packed_forms(c, 0).nt;
  if (c.t[2].dtype() == DType::f32)
    gemm_bf16(T, out, in, 1.0f, x, w, 0.0f, c.f32(2), out);
  else
    gemm_bf16_out(T, out, in, 1.0f, x, w, c.t[2].data<uint16_t>(), out);
}

void linear_backward_input_row(const Ctx& ctx, OpCall& c) {  // dx = dy w + beta dx
  if (!bf16_native() || !dense(c, {0, 1, 2})) return staged(ctx, c, {1});
  const bool dx_f32 = c.t[2].dtype() == DType::f32;
  if (!dx_f32 && c.f != 0.0f) return staged(ctx, c, {1});  // a bf16 dx that is read
  const int64_t T = c.n[0], in = c.n[1], out = c.n[2];
  const Bf16Operand dy = operand(c, 0, false, out);
  Bf16Operand w = operand(c, 1, false, in);
  w.packed = packed_forms(c, 0).nn;
  if (dx_f32)
    gemm_bf16(T, in, out, 1.0f, dy, w, c.f, c.f32(2), in);
  else
    gemm_bf16_out(T, in, out, 1.0f, dy, w, c.t[2].data<uint16_t>(), in);
}

void linear_backward_weight_row(const Ctx& ctx, OpCall& c) {  // dw += dyᵀ x
  if (!bf16_native() || !dense(c, {0, 1, 2}) || c.t[2].dtype() != DType::f32)
    return run_staged(ctx, c);
  const int64_t T = c.n[0], in = c.n[1], out = c.n[2];
  const Bf16Operand dy = operand(c, 0, true, out), x = operand(c, 1, false, in);
  gemm_bf16(out, in, T, 1.0f, dy, x, 1.0f, c.f32(2), in);
}

F32OrBf16 arg(const OpCall& c, int i) {
  const Tensor& t = c.t[size_t(i)];
  if (t.dtype() == DType::f32) return {t.data<float>(), true};
  return {t.data<uint16_t>(), false};
}

SwigluBf16 swiglu_args(const OpCall& c, int x, int wg) {
  SwigluBf16 s{c.n[0], c.n[1], c.n[2], arg(c, x), arg(c, wg), arg(c, wg + 1), arg(c, wg + 2)};
  for (int i = 0; i < 3; ++i) s.packed[i] = packed_forms(c, i);
  return s;
}

void swiglu_forward_row(const Ctx& ctx, OpCall& c) {
  if (!bf16_native() || c.n[0] == 0 || !dense(c, {0, 1, 2, 3, 4, 5, 6}))
    return staged(ctx, c, {1, 2, 3});
  swiglu_forward_bf16(ctx, swiglu_args(c, 0, 1), arg(c, 4), arg(c, 5), arg(c, 6));
}

void swiglu_backward_row(const Ctx& ctx, OpCall& c) {
  // dy and the gradients are f32 (the staged row takes the rest)
  const bool f32_grads = c.t[3].dtype() == DType::f32 && c.t[7].dtype() == DType::f32 &&
                         c.t[8].dtype() == DType::f32 && c.t[9].dtype() == DType::f32 &&
                         c.t[10].dtype() == DType::f32;
  if (!bf16_native() || c.n[0] == 0 || !dense(c, {0, 1, 2, 3, 4, 5, 6, 8, 9, 10}) || !f32_grads)
    return staged(ctx, c, {4, 5, 6});
  swiglu_backward_bf16(ctx, swiglu_args(c, 0, 4), arg(c, 1), arg(c, 2), c.f32(3), c.f32(7),
                       c.f32(8), c.f32(9), c.f32(10));
}

void attention_forward_row(const Ctx& ctx, OpCall& c) {  // q, k, v bf16; out; lse f32
  const bool fits = c.t[0].dtype() == DType::bf16 && c.t[1].dtype() == DType::bf16 &&
                    c.t[2].dtype() == DType::bf16 && c.t[4].dtype() == DType::f32 && dense(c, {3});
  if (!bf16_native() || !fits || c.t[0].numel() == 0 || c.t[1].numel() == 0)
    return run_staged(ctx, c);
  attention_forward_bf16(ctx, c.par<AttnShape>(), c.t[0].data<uint16_t>(), c.t[1].data<uint16_t>(),
                         c.t[2].data<uint16_t>(), arg(c, 3), c.f32(4));
}

void attention_backward_row(const Ctx& ctx, OpCall& c) {  // bf16 q k v out dout; f32 lse, grads
  bool fits = c.t[1].numel() > 0 && c.t[0].numel() > 0;
  for (int i : {0, 1, 2, 3, 5}) fits = fits && c.t[size_t(i)].dtype() == DType::bf16;
  for (int i : {4, 6, 7, 8}) fits = fits && c.t[size_t(i)].dtype() == DType::f32;
  if (!bf16_native() || !fits) return run_staged(ctx, c);
  auto bf = [&](int i) { return c.t[size_t(i)].data<uint16_t>(); };
  attention_backward_bf16(
      ctx, c.par<AttnShape>(),
      {bf(0), bf(1), bf(2), bf(3), bf(5), c.f32(4), c.f32(6), c.f32(7), c.f32(8)});
}

// out[i] = x[src_row[i]] rounded to bf16, one pass (the MoE layer's expert
// rows at ep = 1): the staged row's bits (an f32 gather, then the same
// rounding), without its f32 copy of the rows. A bf16 x is the staged row's.
void gather_rows_row(const Ctx& ctx, OpCall& c) {
  const bool fits = c.t[0].dtype() == DType::f32 && c.t[2].dtype() == DType::bf16;
  if (!bf16_native() || !fits) return run_staged(ctx, c);
  const int64_t n = c.n[0], d = c.n[1];
  const float* x = c.f32(0);
  const int64_t* src = c.index<int64_t>(1);
  uint16_t* out = c.t[2].data<uint16_t>();
  for (int64_t i = 0; i < n; ++i) round_bf16(x + src[i] * d, d, out + i * d);
}

constexpr OpRow kRows[] = {
    {Op::linear_forward, DeviceType::cpu, DType::bf16, &linear_forward_row},
    {Op::linear_backward_input, DeviceType::cpu, DType::bf16, &linear_backward_input_row},
    {Op::linear_backward_weight, DeviceType::cpu, DType::bf16, &linear_backward_weight_row},
    {Op::swiglu_forward, DeviceType::cpu, DType::bf16, &swiglu_forward_row},
    {Op::swiglu_backward, DeviceType::cpu, DType::bf16, &swiglu_backward_row},
    {Op::attention_forward, DeviceType::cpu, DType::bf16, &attention_forward_row},
    {Op::attention_backward, DeviceType::cpu, DType::bf16, &attention_backward_row},
    {Op::gather_rows, DeviceType::cpu, DType::bf16, &gather_rows_row},
};

}  // namespace

Bf16Units bf16_units() {
  static const Bf16Units units = detect();
  return units;
}

Bf16Mode bf16_mode_from_env() {
  const char* v = std::getenv("TRIDENT_CPU_BF16");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return Bf16Mode::automatic;
  if (std::strcmp(v, "staged") == 0) return Bf16Mode::staged;
  if (std::strcmp(v, "native") == 0) return Bf16Mode::native;
  throw InputError(std::string("TRIDENT_CPU_BF16=") + v + ": expected staged, native or auto");
}

bool bf16_native() {
  int v = g_native.load(std::memory_order_relaxed);
  if (v < 0) {
    v = resolve(bf16_mode_from_env()) ? 1 : 0;
    g_native.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_bf16_mode(Bf16Mode mode) { g_native.store(resolve(mode) ? 1 : 0); }

std::string bf16_path() {
  if (bf16_native()) return "native (AVX512-BF16)";
  if (!bf16_units().avx512_bf16) return "staged (no AVX512-BF16)";
  return g_chosen.load() ? "staged (chosen at run time)" : "staged (TRIDENT_CPU_BF16=staged)";
}

std::span<const OpRow> bf16_rows() { return kRows; }

}  // namespace trident::kernels::cpu

namespace trident::kernels {

std::string cpu_bf16_kernels() { return cpu::bf16_path(); }

void set_cpu_bf16_path(const std::string& path) {
  using cpu::Bf16Mode;
  Bf16Mode mode = Bf16Mode::automatic;
  if (path.empty())
    mode = cpu::bf16_mode_from_env();
  else if (path == "staged")
    mode = Bf16Mode::staged;
  else if (path == "native")
    mode = Bf16Mode::native;
  else if (path != "auto")
    throw InputError("CPU bf16 path '" + path + "': expected staged, native, auto or empty");
  if (mode == Bf16Mode::native && !cpu::bf16_units().avx512_bf16)
    throw InputError("CPU bf16 path native: this CPU has no AVX512-BF16 (vdpbf16ps)");
  cpu::set_bf16_mode(mode);
  cpu::g_chosen.store(!path.empty());
}

}  // namespace trident::kernels

namespace trident::kernels {

bool cpu_bf16_packs_weights() { return cpu::bf16_native(); }

// Packed only where the native rows will read it: a CPU tensor while native
// bf16 is on (a later switch to staged leaves the forms unread, the staged
// row rounding the weight instead).
PackedBf16Weight::PackedBf16Weight(const Ctx& ctx, const Tensor& w)
    : w_(Tensor::borrow(w.data_ptr(), w.shape(), w.device(), w.dtype())) {
  const bool float_data = w.dtype() == DType::f32 || w.dtype() == DType::bf16;
  if (!ctx.device.is_cpu() || !float_data || w.ndim() != 2 || w.numel() == 0 || !cpu::bf16_native())
    return;
  const int64_t out = w.shape()[0], in = w.shape()[1];
  nt_.resize(size_t(cpu::bf16_packed_words(out, in)));
  nn_.resize(size_t(cpu::bf16_packed_words(in, out)));
}

void PackedBf16Weight::refresh(const Tensor& w) {
  TRIDENT_CHECK(w.shape() == w_.shape() && w.dtype() == w_.dtype(),
                "PackedBf16Weight::refresh: " + w.shape_str() + " " + dtype_name(w.dtype()) +
                    " is not the weight's shape and dtype, " + w_.shape_str() + " " +
                    dtype_name(w_.dtype()));
  w_ = Tensor::borrow(w.data_ptr(), w.shape(), w.device(), w.dtype());
  refresh();
}

// An f32 weight is rounded to bf16 as it is packed (the GEMM's rounding,
// that of kernels::convert): the words of its bf16 copy.
void PackedBf16Weight::refresh() {
  if (nt_.empty()) return;
  const int64_t out = w_.shape()[0], in = w_.shape()[1];
  const bool f32 = w_.dtype() == DType::f32;
  const void* w = f32 ? static_cast<const void*>(w_.data<float>())
                      : static_cast<const void*>(w_.data<uint16_t>());
  cpu::pack_bf16_b(out, in, {w, f32, true, in}, nt_.data());   // op(B) = Wᵀ: [K = in, N = out]
  cpu::pack_bf16_b(in, out, {w, f32, false, in}, nn_.data());  // op(B) = W: [K = out, N = in]
}

}  // namespace trident::kernels
