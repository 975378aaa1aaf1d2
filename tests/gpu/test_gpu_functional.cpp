// The tensor ops with bf16 operands on a GPU (kernels/api/functional.cpp):
// the GEMMs and attention run the native bf16 kernels (cuBLAS with fp32
// accumulation, the bf16 flash attention) where the CPU stages (widens the
// same bf16 values to fp32, computes, rounds outputs to nearest even). Both
// see the same bf16 operands, so the results agree within harness.hpp's
// bounds: fp32 outputs to fp32's (1e-4 for a GEMM's summation order, 1e-5
// for attention's fp32 arithmetic), bf16 outputs within two roundings (each
// side rounds its own fp32 result), plus P's rounding on tensor cores.
#include <cmath>
#include <cstring>
#include <string>

#include "harness.hpp"
#include "trident/core/allocator.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"

using namespace gpu_test;
namespace k = trident::kernels;
using trident::DType;
using trident::Tensor;

namespace {

// A host bf16 tensor of normal(0, scale) values (rounded to nearest even).
Tensor host_bf16(std::vector<int64_t> shape, const char* name, float scale = 1.0f) {
  Tensor t = Tensor::empty(std::move(shape), trident::cpu_allocator(), DType::bf16);
  const auto bits = to_bits(randn(size_t(t.numel()), name, scale));
  std::memcpy(t.data_ptr(), bits.data(), t.bytes());
  return t;
}

Tensor host_f32(std::vector<int64_t> shape, const char* name) {
  Tensor t(std::move(shape));
  const auto v = randn(size_t(t.numel()), name);
  std::memcpy(t.data_ptr(), v.data(), t.bytes());
  return t;
}

// The values of a host or device tensor (bf16 widened exactly), on the host.
std::vector<float> values(const k::Ctx& ctx, const Tensor& t) {
  const Tensor h = t.device().is_cuda() ? k::to_host(ctx, t) : t;
  std::vector<float> out(size_t(h.numel()));
  if (h.dtype() == DType::f32) {
    std::memcpy(out.data(), h.data_ptr(), h.bytes());
  } else {
    std::vector<cuda::Bf16> bits(out.size());
    std::memcpy(bits.data(), h.data_ptr(), h.bytes());
    out = from_bits(bits);
  }
  return out;
}

}  // namespace

GPU_TEST("bf16 linear ops run cuBLAS's bf16 GEMM and match the CPU's staged bf16") {
  const k::Ctx ctx = dc.ctx();
  const k::Ctx cpu;  // the host
  const int64_t T = 96, in = 128, out = 80;
  const Tensor x = host_bf16({T, in}, "lin x"), w = host_bf16({out, in}, "lin w", 0.1f);
  const Tensor gx = k::clone(ctx, x), gw = k::clone(ctx, w);

  Tensor y({T, out});
  k::linear_forward(cpu, x, w, y);
  Tensor gy = k::zeros(ctx, {T, out});
  k::linear_forward(ctx, gx, gw, gy);
  check_close("y = x w^T, f32 out", values(ctx, gy), values(cpu, y), 1e-4);

  Tensor yb = Tensor::empty({T, out}, trident::cpu_allocator(), DType::bf16);
  k::linear_forward(cpu, x, w, yb);
  Tensor gyb = k::empty(ctx, {T, out}, DType::bf16);
  k::linear_forward(ctx, gx, gw, gyb);
  // Both sides rounded to bf16 from fp32 sums in different orders: 2u.
  check_close("y = x w^T, bf16 out", values(ctx, gyb), values(cpu, yb), kBf16Rounded + 1e-4);

  // dx = dy w + dx (beta 1) and dw += dy^T x: increments over random fp32 bases
  const Tensor dy = host_bf16({T, out}, "lin dy");
  const Tensor gdy = k::clone(ctx, dy);
  const Tensor dx0 = host_f32({T, in}, "lin dx0"), dw0 = host_f32({out, in}, "lin dw0");
  Tensor dx = dx0.clone(), dw = dw0.clone();
  Tensor gdx = k::clone(ctx, dx0), gdw = k::clone(ctx, dw0);
  k::linear_backward_input(cpu, dy, w, dx, 1.0f);
  k::linear_backward_input(ctx, gdy, gw, gdx, 1.0f);
  check_increment("dx += dy w", values(ctx, gdx), values(cpu, dx), values(cpu, dx0), 1e-4);
  k::linear_backward_weight(cpu, dy, x, dw);
  k::linear_backward_weight(ctx, gdy, gx, gdw);
  check_increment("dw += dy^T x", values(ctx, gdw), values(cpu, dw), values(cpu, dw0), 1e-4);
}

GPU_TEST("bf16 attention runs the bf16 kernels and matches the CPU's staged bf16") {
  const k::Ctx ctx = dc.ctx();
  const k::Ctx cpu;         // the host
  for (int D : {64, 40}) {  // tensor cores (64) and the CUDA-core path
    k::AttnShape s;
    s.Tq = s.Tk = 150;
    s.H = 4, s.Hkv = 2, s.D = D;
    s.scale = 1.0f / std::sqrt(float(D));
    s.causal = true;
    const std::string tag = "D=" + std::to_string(D);
    const Tensor q = host_bf16({s.Tq, s.H, D}, "att q"), kk = host_bf16({s.Tk, s.Hkv, D}, "att k"),
                 v = host_bf16({s.Tk, s.Hkv, D}, "att v");
    const Tensor gq = k::clone(ctx, q), gk = k::clone(ctx, kk), gv = k::clone(ctx, v);
    Tensor o = Tensor::empty({s.Tq, s.H, D}, trident::cpu_allocator(), DType::bf16);
    Tensor lse({s.Tq, s.H});
    k::attention_forward(cpu, s, q, kk, v, o, lse);
    Tensor go = k::empty(ctx, {s.Tq, s.H, D}, DType::bf16);
    Tensor glse = k::zeros(ctx, {s.Tq, s.H});
    k::attention_forward(ctx, s, gq, gk, gv, go, glse);
    check_close("attention out " + tag, values(ctx, go), values(cpu, o), kBf16AttentionRounded);
    check_close("attention lse " + tag, values(ctx, glse), values(cpu, lse), 1e-5);

    // the backward from the CPU's output and lse on both sides
    const Tensor dout = host_bf16({s.Tq, s.H, D}, "att dout");
    const Tensor dq0 = host_f32({s.Tq, s.H, D}, "att dq0"),
                 dk0 = host_f32({s.Tk, s.Hkv, D}, "att dk0"),
                 dv0 = host_f32({s.Tk, s.Hkv, D}, "att dv0");
    Tensor dq = dq0.clone(), dk = dk0.clone(), dv = dv0.clone();
    k::attention_backward(cpu, s, q, kk, v, o, lse, dout, dq, dk, dv);
    Tensor gdq = k::clone(ctx, dq0), gdk = k::clone(ctx, dk0), gdv = k::clone(ctx, dv0);
    k::attention_backward(ctx, s, gq, gk, gv, k::clone(ctx, o), k::clone(ctx, lse),
                          k::clone(ctx, dout), gdq, gdk, gdv);
    check_increment("attention dq " + tag, values(ctx, gdq), values(cpu, dq), values(cpu, dq0),
                    1e-5);
    check_increment("attention dk " + tag, values(ctx, gdk), values(cpu, dk), values(cpu, dk0),
                    1e-5);
    check_increment("attention dv " + tag, values(ctx, gdv), values(cpu, dv), values(cpu, dv0),
                    1e-5);
  }
}
