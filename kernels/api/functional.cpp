// The ops on tensors: shape and dtype checks, then the pointer form of the
// op (kernels/api/ops.cpp routes it to the backend of ctx.device).
//
// f32 tensors go straight through. A bf16 tensor is staged: widened into an
// f32 buffer from ctx's allocator before the kernel (inputs, and outputs the
// kernel accumulates into), narrowed back with round-to-nearest-even after
// it (outputs). That is the reference semantics of bf16 for every backend;
// a backend with a native bf16 kernel for an op may replace the staging. The
// CUDA backend does for the GEMMs whose two operands are bf16 (cuBLAS with
// fp32 accumulation, the output f32, or bf16 rounded to nearest even) and for
// attention on bf16 q, k, v, out (and dout) with fp32 lse and gradients: the
// same arithmetic on the same bf16 operands, in another summation order.
#include "trident/kernels/functional.hpp"

#include <initializer_list>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/kernels/swiglu.hpp"
#include "trident/kernels/tensor_ops.hpp"
#ifdef TRIDENT_HAVE_CUDA
#include "trident/kernels/cuda/ops.hpp"
#endif

namespace trident::kernels {
namespace {

std::string describe(const Tensor& t) { return t.shape_str() + " " + dtype_name(t.dtype()); }

void check_device(const Ctx& ctx, const char* op, const char* what, const Tensor& t) {
  if (t.numel() == 0) return;
  TRIDENT_CHECK(t.device() == ctx.device, std::string("kernels::") + op + ": " + what + " " +
                                              describe(t) + " is on " + t.device().str() +
                                              ", the op runs on " + ctx.device.str());
}

void check_numel(const char* op, const char* what, const Tensor& t, int64_t want) {
  TRIDENT_CHECK(t.numel() == want, std::string("kernels::") + op + ": " + what + " " + describe(t) +
                                       " should hold " + std::to_string(want) + " elements");
}

void check_index(const Ctx& ctx, const char* op, const char* what, const Tensor& t, DType want) {
  TRIDENT_CHECK(t.numel() == 0 || t.dtype() == want, std::string("kernels::") + op + ": " + what +
                                                         " " + describe(t) + " should be " +
                                                         dtype_name(want));
  check_device(ctx, op, what, t);
}

// Rows of an activation whose rows are `width` wide.
int64_t rows_of(const char* op, const char* what, const Tensor& t, int64_t width) {
  TRIDENT_CHECK(width > 0 && t.numel() % width == 0,
                std::string("kernels::") + op + ": " + what + " " + describe(t) +
                    " is not a whole number of rows of " + std::to_string(width));
  return t.numel() / width;
}

#ifdef TRIDENT_HAVE_CUDA
// Whether the call runs a native bf16 kernel: on a CUDA device, with every
// tensor of `bf16` in bf16 and every tensor of `f32` in f32 (the kernel's
// signature); the tensors are checked to be on the op's device.
bool native_bf16(const Ctx& ctx, const char* op, std::initializer_list<const Tensor*> bf16,
                 std::initializer_list<const Tensor*> f32 = {}) {
  if (ctx.device.type != DeviceType::cuda) return false;
  for (const Tensor* t : bf16)
    if (t->dtype() != DType::bf16 || t->numel() == 0) return false;
  for (const Tensor* t : f32)
    if (t->dtype() != DType::f32) return false;
  for (const Tensor* t : bf16) check_device(ctx, op, "operand", *t);
  for (const Tensor* t : f32) check_device(ctx, op, "operand", *t);
  return true;
}

const cuda::Bf16* bf(const Tensor& t) {
  return reinterpret_cast<const cuda::Bf16*>(t.data<uint16_t>());
}
cuda::Bf16* bf_out(const Tensor& t) { return reinterpret_cast<cuda::Bf16*>(t.data<uint16_t>()); }
#endif

// The float tensors of one call as the f32 kernels see them (see the file
// comment). finish() narrows the staged outputs; it must run after the
// kernel, so a call that throws leaves bf16 outputs unwritten.
class F32Args {
 public:
  F32Args(const Ctx& ctx, const char* op) : ctx_(ctx), op_(op) {}

  const float* in(const char* what, const Tensor& t) { return stage(what, t, false, true); }
  float* out(const char* what, const Tensor& t) { return stage(what, t, true, false); }
  float* inout(const char* what, const Tensor& t) { return stage(what, t, true, true); }
  // An optional output (empty: the kernel gets nullptr).
  float* out_or_null(const char* what, const Tensor& t) {
    return t.numel() == 0 ? nullptr : inout(what, t);
  }

  void finish() {
    for (auto& s : staged_)
      if (s.write) convert(ctx_, s.wide, s.orig);
  }

 private:
  struct Staged {
    Tensor orig, wide;
    bool write;
  };

  float* stage(const char* what, const Tensor& t, bool write, bool read) {
    check_device(ctx_, op_, what, t);
    if (t.dtype() == DType::f32) return t.numel() ? t.data<float>() : nullptr;
    TRIDENT_CHECK(t.dtype() == DType::bf16, std::string("kernels::") + op_ + ": " + what + " " +
                                                describe(t) + " should be f32 or bf16");
    Tensor wide = empty(ctx_, t.shape(), DType::f32);
    if (read) convert(ctx_, t, wide);
    staged_.push_back({t, wide, write});
    return wide.data<float>();
  }

  const Ctx& ctx_;
  const char* op_;
  std::vector<Staged> staged_;
};

}  // namespace

void convert(const Ctx& ctx, const Tensor& src, const Tensor& dst) {
  check_numel("convert", "dst", dst, src.numel());
  check_device(ctx, "convert", "src", src);
  check_device(ctx, "convert", "dst", dst);
  if (src.numel() == 0) return;
  const DType a = src.dtype(), b = dst.dtype();
  if (a == b) {
    Tensor d = dst;
    copy(ctx, d, src);
  } else if (a == DType::f32 && b == DType::bf16) {
    to_bf16(ctx, src.data<float>(), src.numel(), dst.data<uint16_t>());
  } else if (a == DType::bf16 && b == DType::f32) {
    from_bf16(ctx, src.data<uint16_t>(), src.numel(), dst.data<float>());
  } else {
    throw Error(std::string("kernels::convert: no conversion from ") + dtype_name(a) + " to " +
                dtype_name(b));
  }
}

void linear_forward(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y) {
  TRIDENT_CHECK(w.ndim() == 2, "kernels::linear_forward: w " + describe(w) + " is not [out, in]");
  const int64_t out = w.dim(0), in = w.dim(1), T = rows_of("linear_forward", "x", x, in);
  check_numel("linear_forward", "y", y, T * out);
#ifdef TRIDENT_HAVE_CUDA
  if (native_bf16(ctx, "linear_forward", {&x, &w})) {  // y = x w^T
    check_device(ctx, "linear_forward", "y", y);
    if (y.dtype() == DType::f32)
      cuda::gemm_bf16(ctx, false, true, T, out, in, 1.0f, bf(x), in, bf(w), in, 0.0f,
                      y.data<float>(), out);
    else
      cuda::gemm_bf16_out(ctx, false, true, T, out, in, 1.0f, bf(x), in, bf(w), in, 0.0f, bf_out(y),
                          out);
    return;
  }
#endif
  F32Args a(ctx, "linear_forward");
  linear_forward(ctx, a.in("x", x), a.in("w", w), T, in, out, a.out("y", y));
  a.finish();
}

void linear_backward_input(const Ctx& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx,
                           float beta) {
  TRIDENT_CHECK(w.ndim() == 2,
                "kernels::linear_backward_input: w " + describe(w) + " is not [out, in]");
  const int64_t out = w.dim(0), in = w.dim(1), T = rows_of("linear_backward_input", "dy", dy, out);
  check_numel("linear_backward_input", "dx", dx, T * in);
#ifdef TRIDENT_HAVE_CUDA
  if (native_bf16(ctx, "linear_backward_input", {&dy, &w}, {&dx})) {  // dx = dy w + beta dx
    cuda::gemm_bf16(ctx, false, false, T, in, out, 1.0f, bf(dy), out, bf(w), in, beta,
                    dx.data<float>(), in);
    return;
  }
#endif
  F32Args a(ctx, "linear_backward_input");
  const float* pdy = a.in("dy", dy);
  const float* pw = a.in("w", w);
  float* pdx = beta != 0.0f ? a.inout("dx", dx) : a.out("dx", dx);
  linear_backward_input(ctx, pdy, pw, T, in, out, pdx, beta);
  a.finish();
}

void linear_backward_weight(const Ctx& ctx, const Tensor& dy, const Tensor& x, const Tensor& dw) {
  TRIDENT_CHECK(dw.ndim() == 2,
                "kernels::linear_backward_weight: dw " + describe(dw) + " is not [out, in]");
  const int64_t out = dw.dim(0), in = dw.dim(1), T = rows_of("linear_backward_weight", "x", x, in);
  check_numel("linear_backward_weight", "dy", dy, T * out);
#ifdef TRIDENT_HAVE_CUDA
  if (native_bf16(ctx, "linear_backward_weight", {&dy, &x}, {&dw})) {  // dw += dy^T x
    cuda::gemm_bf16(ctx, true, false, out, in, T, 1.0f, bf(dy), out, bf(x), in, 1.0f,
                    dw.data<float>(), in);
    return;
  }
#endif
  F32Args a(ctx, "linear_backward_weight");
  const float* pdy = a.in("dy", dy);
  const float* px = a.in("x", x);
  linear_backward_weight(ctx, pdy, px, T, in, out, a.inout("dw", dw));
  a.finish();
}

void rmsnorm_forward(const Ctx& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                     const Tensor& rstd) {
  const int64_t d = w.numel(), T = rows_of("rmsnorm_forward", "x", x, d);
  check_numel("rmsnorm_forward", "y", y, T * d);
  check_numel("rmsnorm_forward", "rstd", rstd, T);
  F32Args a(ctx, "rmsnorm_forward");
  const float* px = a.in("x", x);
  const float* pw = a.in("w", w);
  rmsnorm_forward(ctx, px, pw, T, d, eps, a.out("y", y), a.out("rstd", rstd));
  a.finish();
}

void rmsnorm_backward(const Ctx& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  const int64_t d = w.numel(), T = rows_of("rmsnorm_backward", "x", x, d);
  check_numel("rmsnorm_backward", "dy", dy, T * d);
  check_numel("rmsnorm_backward", "dx", dx, T * d);
  check_numel("rmsnorm_backward", "rstd", rstd, T);
  if (dw.numel()) check_numel("rmsnorm_backward", "dw", dw, d);
  F32Args a(ctx, "rmsnorm_backward");
  const float* pdy = a.in("dy", dy);
  const float* px = a.in("x", x);
  const float* pw = a.in("w", w);
  const float* pr = a.in("rstd", rstd);
  float* pdx = a.out("dx", dx);
  rmsnorm_backward(ctx, pdy, px, pw, pr, T, d, pdx, a.out_or_null("dw", dw));
  a.finish();
}

namespace {

template <class Kernel>
void rope(const Ctx& ctx, const char* op, const Tensor& x, const Tensor& pos, int64_t D,
          Kernel kernel) {
  check_index(ctx, op, "pos", pos, DType::i64);
  const int64_t T = pos.numel(), H = T ? rows_of(op, "x", x, T * D) : 0;
  check_numel(op, "x", x, T * H * D);
  F32Args a(ctx, op);
  kernel(a.inout("x", x), pos.numel() ? pos.data<int64_t>() : nullptr, T, H);
  a.finish();
}

}  // namespace

void rope_forward(const Ctx& ctx, const Tensor& x, const Tensor& pos, int64_t D,
                  const RopeFreqs& freqs) {
  rope(ctx, "rope_forward", x, pos, D, [&](float* px, const int64_t* pp, int64_t T, int64_t H) {
    rope_forward(ctx, px, pp, T, H, D, freqs);
  });
}

void rope_backward(const Ctx& ctx, const Tensor& dx, const Tensor& pos, int64_t D,
                   const RopeFreqs& freqs) {
  rope(ctx, "rope_backward", dx, pos, D, [&](float* px, const int64_t* pp, int64_t T, int64_t H) {
    rope_backward(ctx, px, pp, T, H, D, freqs);
  });
}

void embedding_forward(const Ctx& ctx, const Tensor& table, const Tensor& ids, const Tensor& out) {
  check_index(ctx, "embedding_forward", "ids", ids, DType::i32);
  TRIDENT_CHECK(table.ndim() == 2,
                "kernels::embedding_forward: table " + describe(table) + " is not [V, d]");
  const int64_t T = ids.numel(), d = table.dim(1);
  check_numel("embedding_forward", "out", out, T * d);
  F32Args a(ctx, "embedding_forward");
  const float* pt = a.in("table", table);
  embedding_forward(ctx, pt, T ? ids.data<int32_t>() : nullptr, T, d, a.out("out", out));
  a.finish();
}

void embedding_backward(const Ctx& ctx, const Tensor& dout, const Tensor& ids,
                        const Tensor& dtable) {
  check_index(ctx, "embedding_backward", "ids", ids, DType::i32);
  TRIDENT_CHECK(dtable.ndim() == 2,
                "kernels::embedding_backward: dtable " + describe(dtable) + " is not [V, d]");
  const int64_t T = ids.numel(), d = dtable.dim(1);
  check_numel("embedding_backward", "dout", dout, T * d);
  F32Args a(ctx, "embedding_backward");
  const float* pd = a.in("dout", dout);
  embedding_backward(ctx, pd, T ? ids.data<int32_t>() : nullptr, T, d, a.inout("dtable", dtable));
  a.finish();
}

double cross_entropy(const Ctx& ctx, const Tensor& logits, const Tensor& targets, float scale,
                     const Tensor& dlogits) {
  check_index(ctx, "cross_entropy", "targets", targets, DType::i32);
  const int64_t T = targets.numel(), V = T ? rows_of("cross_entropy", "logits", logits, T) : 0;
  check_numel("cross_entropy", "logits", logits, T * V);
  check_numel("cross_entropy", "dlogits", dlogits, T * V);
  F32Args a(ctx, "cross_entropy");
  const float* pl = a.in("logits", logits);
  const double loss = cross_entropy(ctx, pl, T ? targets.data<int32_t>() : nullptr, T, V, scale,
                                    a.out("dlogits", dlogits));
  a.finish();
  return loss;
}

void swiglu_forward(const Ctx& ctx, const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                    const Tensor& w_down, const Tensor& y, const Tensor& gate, const Tensor& up) {
  TRIDENT_CHECK(w_gate.ndim() == 2,
                "kernels::swiglu_forward: w_gate " + describe(w_gate) + " is not [f, d]");
  const int64_t f = w_gate.dim(0), d = w_gate.dim(1), T = rows_of("swiglu_forward", "x", x, d);
  check_numel("swiglu_forward", "w_up", w_up, f * d);
  check_numel("swiglu_forward", "w_down", w_down, d * f);
  check_numel("swiglu_forward", "y", y, T * d);
  check_numel("swiglu_forward", "gate", gate, T * f);
  check_numel("swiglu_forward", "up", up, T * f);
  F32Args a(ctx, "swiglu_forward");
  const float* px = a.in("x", x);
  const float* pg = a.in("w_gate", w_gate);
  const float* pu = a.in("w_up", w_up);
  const float* pd = a.in("w_down", w_down);
  float* py = a.out("y", y);
  float* pgate = a.out("gate", gate);
  swiglu_forward(ctx, px, T, d, f, pg, pu, pd, py, pgate, a.out("up", up));
  a.finish();
}

void swiglu_backward(const Ctx& ctx, const Tensor& x, const Tensor& gate, const Tensor& up,
                     const Tensor& dy, const Tensor& w_gate, const Tensor& w_up,
                     const Tensor& w_down, const Tensor& dx, const Tensor& dw_gate,
                     const Tensor& dw_up, const Tensor& dw_down) {
  TRIDENT_CHECK(w_gate.ndim() == 2,
                "kernels::swiglu_backward: w_gate " + describe(w_gate) + " is not [f, d]");
  const int64_t f = w_gate.dim(0), d = w_gate.dim(1), T = rows_of("swiglu_backward", "x", x, d);
  check_numel("swiglu_backward", "gate", gate, T * f);
  check_numel("swiglu_backward", "up", up, T * f);
  check_numel("swiglu_backward", "dy", dy, T * d);
  check_numel("swiglu_backward", "dx", dx, T * d);
  check_numel("swiglu_backward", "dw_gate", dw_gate, f * d);
  check_numel("swiglu_backward", "dw_up", dw_up, f * d);
  check_numel("swiglu_backward", "dw_down", dw_down, d * f);
  F32Args a(ctx, "swiglu_backward");
  const float* px = a.in("x", x);
  const float* pgate = a.in("gate", gate);
  const float* pup = a.in("up", up);
  const float* pdy = a.in("dy", dy);
  const float* pwg = a.in("w_gate", w_gate);
  const float* pwu = a.in("w_up", w_up);
  const float* pwd = a.in("w_down", w_down);
  float* pdx = a.out("dx", dx);
  float* pdwg = a.inout("dw_gate", dw_gate);
  float* pdwu = a.inout("dw_up", dw_up);
  swiglu_backward(ctx, px, pgate, pup, pdy, T, d, f, pwg, pwu, pwd, pdx, pdwg, pdwu,
                  a.inout("dw_down", dw_down));
  a.finish();
}

namespace {

void check_attention(const char* op, const AttnShape& s, const Tensor& q, const Tensor& k,
                     const Tensor& v, const Tensor& out, const Tensor& lse) {
  check_attn_shape(s);
  const int64_t nq = s.Tq * s.H * s.D, nk = s.Tk * s.Hkv * s.D;
  check_numel(op, "q", q, nq);
  check_numel(op, "k", k, nk);
  check_numel(op, "v", v, nk);
  check_numel(op, "out", out, nq);
  check_numel(op, "lse", lse, s.Tq * s.H);
}

}  // namespace

void attention_forward(const Ctx& ctx, const AttnShape& s, const Tensor& q, const Tensor& k,
                       const Tensor& v, const Tensor& out, const Tensor& lse) {
  check_attention("attention_forward", s, q, k, v, out, lse);
#ifdef TRIDENT_HAVE_CUDA
  if (native_bf16(ctx, "attention_forward", {&q, &k, &v, &out}, {&lse})) {
    cuda::attention_forward_bf16(ctx, s, bf(q), bf(k), bf(v), bf_out(out), lse.data<float>());
    return;
  }
#endif
  F32Args a(ctx, "attention_forward");
  const float* pq = a.in("q", q);
  const float* pk = a.in("k", k);
  const float* pv = a.in("v", v);
  float* po = a.out("out", out);
  attention_forward(ctx, s, pq, pk, pv, po, a.out("lse", lse));
  a.finish();
}

void attention_backward(const Ctx& ctx, const AttnShape& s, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  check_attention("attention_backward", s, q, k, v, out, lse);
  check_numel("attention_backward", "dout", dout, q.numel());
  check_numel("attention_backward", "dq", dq, q.numel());
  check_numel("attention_backward", "dk", dk, k.numel());
  check_numel("attention_backward", "dv", dv, v.numel());
#ifdef TRIDENT_HAVE_CUDA
  if (native_bf16(ctx, "attention_backward", {&q, &k, &v, &out, &dout}, {&lse, &dq, &dk, &dv})) {
    cuda::attention_backward_bf16(ctx, s, bf(q), bf(k), bf(v), bf(out), lse.data<float>(), bf(dout),
                                  dq.data<float>(), dk.data<float>(), dv.data<float>());
    return;
  }
#endif
  F32Args a(ctx, "attention_backward");
  const float* pq = a.in("q", q);
  const float* pk = a.in("k", k);
  const float* pv = a.in("v", v);
  const float* po = a.in("out", out);
  const float* pl = a.in("lse", lse);
  const float* pdo = a.in("dout", dout);
  float* pdq = a.inout("dq", dq);
  float* pdk = a.inout("dk", dk);
  attention_backward(ctx, s, pq, pk, pv, po, pl, pdo, pdq, pdk, a.inout("dv", dv));
  a.finish();
}

void adamw_step(const Ctx& ctx, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                const AdamWHyper& h, int64_t step, float grad_scale, bool decay) {
  const int64_t n = p.numel();
  check_numel("adamw_step", "g", g, n);
  check_numel("adamw_step", "m", m, n);
  check_numel("adamw_step", "v", v, n);
  F32Args a(ctx, "adamw_step");
  float* pp = a.inout("p", p);
  const float* pg = a.in("g", g);
  float* pm = a.inout("m", m);
  adamw_step(ctx, pp, pg, pm, a.inout("v", v), n, h, step, grad_scale, decay);
  a.finish();
}

void add_inplace(const Ctx& ctx, const Tensor& y, const Tensor& x) {
  check_numel("add_inplace", "x", x, y.numel());
  F32Args a(ctx, "add_inplace");
  float* py = a.inout("y", y);
  add_inplace(ctx, py, a.in("x", x), y.numel());
  a.finish();
}

void fill(const Ctx& ctx, const Tensor& x, float value) {
  F32Args a(ctx, "fill");
  fill(ctx, a.out("x", x), x.numel(), value);
  a.finish();
}

double sum_squares(const Ctx& ctx, const Tensor& x) {
  F32Args a(ctx, "sum_squares");
  return sum_squares(ctx, a.in("x", x), x.numel());
}

}  // namespace trident::kernels
