// The ops on tensors: each entry checks its shapes and dtypes, derives the
// sizes, and runs the op's row of the op table for ctx.device and the
// call's dtype (op_table.hpp). Nothing here names a backend or a dtype's
// kernel: bf16 staging (widen, the f32 kernel, round back to nearest even)
// is the table's default bf16 row, and a backend's native bf16 kernels are
// its own rows (kernels/cuda/op_rows.cpp).
#include "trident/kernels/functional.hpp"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <string>

#include "trident/core/error.hpp"
#include "trident/kernels/moe.hpp"
#include "trident/kernels/op_table.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/tensor_ops.hpp"

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

bool is_float(DType t) { return t == DType::f32 || t == DType::bf16; }

// The error for tensor i of op, which is not float data on ctx.device.
[[noreturn]] void bad_tensor(const Ctx& ctx, Op op, int i, const Tensor& t) {
  const std::string what = op_arg_name(op, i);
  check_device(ctx, op_name(op), what.c_str(), t);
  throw Error(std::string("kernels::") + op_name(op) + ": " + what + " " + describe(t) +
              " should be float data (f32 or bf16)");
}

// The call of `op` on `tensors` (op_list.inc's order), its float tensors
// checked to be float data on ctx.device (the message is built only for a
// tensor that is not); run() then looks up its row.
OpCall call_of(const Ctx& ctx, Op op, std::initializer_list<Tensor> tensors) {
  OpCall c;
  c.op = op;
  std::copy(tensors.begin(), tensors.end(), c.t.begin());
  const char* roles = op_roles(op);
  for (int i = 0; roles[i]; ++i) {
    const Tensor& t = c.t[size_t(i)];
    if (roles[i] == 'x' || t.numel() == 0) continue;
    if (t.device() != ctx.device || !is_float(t.dtype())) bad_tensor(ctx, op, i, t);
  }
  return c;
}

// packed must be w's own packed form (its shape, dtype and buffer) when
// given: one line naming both otherwise.
void check_packed(const char* op, const char* what, const Tensor& w,
                  const PackedBf16Weight* packed) {
  if (packed == nullptr) return;
  const Tensor& src = packed->source();
  const bool same_shape = src.shape() == w.shape() && src.dtype() == w.dtype();
  if (same_shape && (w.numel() == 0 || src.data_ptr() == w.data_ptr())) return;
  throw Error(std::string("kernels::") + op + ": packed " + what + " is the packed form of " +
              (same_shape ? "another tensor " : "") + describe(src) + ", not of " + what + " " +
              describe(w));
}

double run(const Ctx& ctx, OpCall c) {
  run_op(ctx, c);
  return c.result;
}

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

void linear_forward(const Ctx& ctx, const Tensor& x, const Tensor& w, const Tensor& y,
                    const PackedBf16Weight* packed) {
  TRIDENT_CHECK(w.ndim() == 2, "kernels::linear_forward: w " + describe(w) + " is not [out, in]");
  check_packed("linear_forward", "w", w, packed);
  const int64_t out = w.dim(0), in = w.dim(1), T = rows_of("linear_forward", "x", x, in);
  check_numel("linear_forward", "y", y, T * out);
  OpCall c = call_of(ctx, Op::linear_forward, {x, w, y});
  c.n = {T, in, out};
  c.packed = {packed};
  run(ctx, c);
}

void linear_backward_input(const Ctx& ctx, const Tensor& dy, const Tensor& w, const Tensor& dx,
                           float beta, const PackedBf16Weight* packed) {
  TRIDENT_CHECK(w.ndim() == 2,
                "kernels::linear_backward_input: w " + describe(w) + " is not [out, in]");
  check_packed("linear_backward_input", "w", w, packed);
  const int64_t out = w.dim(0), in = w.dim(1), T = rows_of("linear_backward_input", "dy", dy, out);
  check_numel("linear_backward_input", "dx", dx, T * in);
  OpCall c = call_of(ctx, Op::linear_backward_input, {dy, w, dx});
  c.n = {T, in, out};
  c.f = beta;
  c.packed = {packed};
  run(ctx, c);
}

void linear_backward_weight(const Ctx& ctx, const Tensor& dy, const Tensor& x, const Tensor& dw) {
  TRIDENT_CHECK(dw.ndim() == 2,
                "kernels::linear_backward_weight: dw " + describe(dw) + " is not [out, in]");
  const int64_t out = dw.dim(0), in = dw.dim(1), T = rows_of("linear_backward_weight", "x", x, in);
  check_numel("linear_backward_weight", "dy", dy, T * out);
  OpCall c = call_of(ctx, Op::linear_backward_weight, {dy, x, dw});
  c.n = {T, in, out};
  run(ctx, c);
}

void rmsnorm_forward(const Ctx& ctx, const Tensor& x, const Tensor& w, float eps, const Tensor& y,
                     const Tensor& rstd) {
  const int64_t d = w.numel(), T = rows_of("rmsnorm_forward", "x", x, d);
  check_numel("rmsnorm_forward", "y", y, T * d);
  check_numel("rmsnorm_forward", "rstd", rstd, T);
  OpCall c = call_of(ctx, Op::rmsnorm_forward, {x, w, y, rstd});
  c.n = {T, d};
  c.f = eps;
  run(ctx, c);
}

void rmsnorm_backward(const Ctx& ctx, const Tensor& dy, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, const Tensor& dx, const Tensor& dw) {
  const int64_t d = w.numel(), T = rows_of("rmsnorm_backward", "x", x, d);
  check_numel("rmsnorm_backward", "dy", dy, T * d);
  check_numel("rmsnorm_backward", "dx", dx, T * d);
  check_numel("rmsnorm_backward", "rstd", rstd, T);
  if (dw.numel()) check_numel("rmsnorm_backward", "dw", dw, d);
  OpCall c = call_of(ctx, Op::rmsnorm_backward, {dy, x, w, rstd, dx, dw});
  c.n = {T, d};
  run(ctx, c);
}

namespace {

void rope(const Ctx& ctx, Op op, const Tensor& x, const Tensor& pos, int64_t D,
          const RopeFreqs& freqs) {
  check_index(ctx, op_name(op), "pos", pos, DType::i64);
  const int64_t T = pos.numel(), H = T ? rows_of(op_name(op), "x", x, T * D) : 0;
  check_numel(op_name(op), "x", x, T * H * D);
  OpCall c = call_of(ctx, op, {x, pos});
  c.n = {T, H, D};
  c.param = &freqs;
  run(ctx, c);
}

}  // namespace

void rope_forward(const Ctx& ctx, const Tensor& x, const Tensor& pos, int64_t D,
                  const RopeFreqs& freqs) {
  rope(ctx, Op::rope_forward, x, pos, D, freqs);
}

void rope_backward(const Ctx& ctx, const Tensor& dx, const Tensor& pos, int64_t D,
                   const RopeFreqs& freqs) {
  rope(ctx, Op::rope_backward, dx, pos, D, freqs);
}

void embedding_forward(const Ctx& ctx, const Tensor& table, const Tensor& ids, const Tensor& out) {
  check_index(ctx, "embedding_forward", "ids", ids, DType::i32);
  TRIDENT_CHECK(table.ndim() == 2,
                "kernels::embedding_forward: table " + describe(table) + " is not [V, d]");
  const int64_t T = ids.numel(), d = table.dim(1);
  check_numel("embedding_forward", "out", out, T * d);
  OpCall c = call_of(ctx, Op::embedding_forward, {table, ids, out});
  c.n = {T, d};
  run(ctx, c);
}

void embedding_backward(const Ctx& ctx, const Tensor& dout, const Tensor& ids,
                        const Tensor& dtable) {
  check_index(ctx, "embedding_backward", "ids", ids, DType::i32);
  TRIDENT_CHECK(dtable.ndim() == 2,
                "kernels::embedding_backward: dtable " + describe(dtable) + " is not [V, d]");
  const int64_t T = ids.numel(), d = dtable.dim(1);
  check_numel("embedding_backward", "dout", dout, T * d);
  OpCall c = call_of(ctx, Op::embedding_backward, {dout, ids, dtable});
  c.n = {T, d};
  run(ctx, c);
}

double cross_entropy(const Ctx& ctx, const Tensor& logits, const Tensor& targets, float scale,
                     const Tensor& dlogits) {
  check_index(ctx, "cross_entropy", "targets", targets, DType::i32);
  const int64_t T = targets.numel(), V = T ? rows_of("cross_entropy", "logits", logits, T) : 0;
  check_numel("cross_entropy", "logits", logits, T * V);
  check_numel("cross_entropy", "dlogits", dlogits, T * V);
  OpCall c = call_of(ctx, Op::cross_entropy, {logits, targets, dlogits});
  c.n = {T, V};
  c.f = scale;
  return run(ctx, c);
}

namespace {

// The SwiGLU's packed weights, each checked against its weight.
std::array<const PackedBf16Weight*, 3> swiglu_packed(const char* op, const Tensor& w_gate,
                                                     const Tensor& w_up, const Tensor& w_down,
                                                     const SwigluPacked& p) {
  check_packed(op, "w_gate", w_gate, p.w_gate);
  check_packed(op, "w_up", w_up, p.w_up);
  check_packed(op, "w_down", w_down, p.w_down);
  return {p.w_gate, p.w_up, p.w_down};
}

}  // namespace

void swiglu_forward(const Ctx& ctx, const Tensor& x, const Tensor& w_gate, const Tensor& w_up,
                    const Tensor& w_down, const Tensor& y, const Tensor& gate, const Tensor& up,
                    const SwigluPacked& packed) {
  TRIDENT_CHECK(w_gate.ndim() == 2,
                "kernels::swiglu_forward: w_gate " + describe(w_gate) + " is not [f, d]");
  const int64_t f = w_gate.dim(0), d = w_gate.dim(1), T = rows_of("swiglu_forward", "x", x, d);
  check_numel("swiglu_forward", "w_up", w_up, f * d);
  check_numel("swiglu_forward", "w_down", w_down, d * f);
  check_numel("swiglu_forward", "y", y, T * d);
  check_numel("swiglu_forward", "gate", gate, T * f);
  check_numel("swiglu_forward", "up", up, T * f);
  OpCall c = call_of(ctx, Op::swiglu_forward, {x, w_gate, w_up, w_down, y, gate, up});
  c.n = {T, d, f};
  c.packed = swiglu_packed("swiglu_forward", w_gate, w_up, w_down, packed);
  run(ctx, c);
}

void swiglu_backward(const Ctx& ctx, const Tensor& x, const Tensor& gate, const Tensor& up,
                     const Tensor& dy, const Tensor& w_gate, const Tensor& w_up,
                     const Tensor& w_down, const Tensor& dx, const Tensor& dw_gate,
                     const Tensor& dw_up, const Tensor& dw_down, const SwigluPacked& packed) {
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
  OpCall c = call_of(ctx, Op::swiglu_backward,
                     {x, gate, up, dy, w_gate, w_up, w_down, dx, dw_gate, dw_up, dw_down});
  c.n = {T, d, f};
  c.packed = swiglu_packed("swiglu_backward", w_gate, w_up, w_down, packed);
  run(ctx, c);
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
  OpCall c = call_of(ctx, Op::attention_forward, {q, k, v, out, lse});
  c.param = &s;
  run(ctx, c);
}

void attention_backward(const Ctx& ctx, const AttnShape& s, const Tensor& q, const Tensor& k,
                        const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,
                        const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  check_attention("attention_backward", s, q, k, v, out, lse);
  check_numel("attention_backward", "dout", dout, q.numel());
  check_numel("attention_backward", "dq", dq, q.numel());
  check_numel("attention_backward", "dk", dk, k.numel());
  check_numel("attention_backward", "dv", dv, v.numel());
  OpCall c = call_of(ctx, Op::attention_backward, {q, k, v, out, lse, dout, dq, dk, dv});
  c.param = &s;
  run(ctx, c);
}

void attention_forward_resume(const Ctx& ctx, const AttnShape& s, const Tensor& q, const Tensor& k,
                              const Tensor& v, const Tensor& out, const Tensor& lse) {
  check_attention("attention_forward_resume", s, q, k, v, out, lse);
  OpCall c = call_of(ctx, Op::attention_forward_resume, {q, k, v, out, lse});
  c.param = &s;
  run(ctx, c);
}

void adamw_step(const Ctx& ctx, const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                const AdamWHyper& h, int64_t step, float grad_scale, bool decay) {
  const int64_t n = p.numel();
  check_numel("adamw_step", "g", g, n);
  check_numel("adamw_step", "m", m, n);
  check_numel("adamw_step", "v", v, n);
  const AdamWArgs args{&h, step, grad_scale, decay};
  OpCall c = call_of(ctx, Op::adamw_step, {p, g, m, v});
  c.param = &args;
  run(ctx, c);
}

void add_inplace(const Ctx& ctx, const Tensor& y, const Tensor& x) {
  check_numel("add_inplace", "x", x, y.numel());
  run(ctx, call_of(ctx, Op::add_inplace, {y, x}));
}

void fill(const Ctx& ctx, const Tensor& x, float value) {
  OpCall c = call_of(ctx, Op::fill, {x});
  c.f = value;
  run(ctx, c);
}

double sum_squares(const Ctx& ctx, const Tensor& x) {
  return run(ctx, call_of(ctx, Op::sum_squares, {x}));
}

// ==== MoE and router ====

namespace {

// The width of the rows of t, which holds `rows` of them (0 when it holds none).
int64_t width_of(const char* op, const char* what, const Tensor& t, int64_t rows) {
  return rows ? rows_of(op, what, t, rows) : 0;
}

// rows as combine_rows reads them: the call's tensor 0, or (blocks) a
// RowSource over the blocks' host memory, which `bases` keeps.
void set_source(const Ctx& ctx, const char* op, const RowBlocks& rows, OpCall& c,
                std::vector<const float*>& bases, RowSource& source) {
  if (rows.blocks.empty()) return;
  TRIDENT_CHECK(rows.first.size() == rows.blocks.size() + 1,
                std::string("kernels::") + op + ": blocks need first [blocks + 1]");
  TRIDENT_CHECK(ctx.device.is_cpu(), std::string("kernels::") + op +
                                         ": row blocks are host memory, the op runs on " +
                                         ctx.device.str());
  for (const Tensor& b : rows.blocks) {
    check_device(ctx, op, "row block", b);
    TRIDENT_CHECK(b.numel() == 0 || b.dtype() == DType::f32,
                  std::string("kernels::") + op + ": row block " + describe(b) + " is not f32");
    bases.push_back(b.numel() ? b.data<float>() : nullptr);
  }
  c.t[0] = Tensor();
  source = RowSource(bases.data(), rows.first.data(), int(rows.blocks.size()));
  c.param = &source;
}

// T, d, k of an unpermute: row [T*k], out (named what) [T, d].
OpCall unpermute_call(const Ctx& ctx, Op op, const Tensor& row, int k, const char* what,
                      const Tensor& out, std::initializer_list<Tensor> tensors) {
  check_index(ctx, op_name(op), "row", row, DType::i64);
  TRIDENT_CHECK(k >= 1 && row.numel() % k == 0, std::string("kernels::") + op_name(op) + ": row " +
                                                    describe(row) + " is not T * k for k " +
                                                    std::to_string(k));
  const int64_t T = row.numel() / k;
  OpCall c = call_of(ctx, op, tensors);
  c.n = {T, width_of(op_name(op), what, out, T), k};
  return c;
}

RouterArgs router_args(const RouterDims& dims, double aux_coef = 0, double z_coef = 0) {
  return RouterArgs{dims, aux_coef, z_coef};
}

void check_router(const Ctx& ctx, const char* op, const RouterDims& d, const Tensor& probs,
                  const Tensor& chosen) {
  check_numel(op, "probs", probs, d.T * d.E);
  check_index(ctx, op, "chosen", chosen, DType::i32);
  check_numel(op, "chosen", chosen, d.T * d.k);
}

}  // namespace

void gather_rows(const Ctx& ctx, const Tensor& x, const Tensor& src_row, const Tensor& out) {
  check_index(ctx, "gather_rows", "src_row", src_row, DType::i64);
  const int64_t n = src_row.numel(), d = width_of("gather_rows", "out", out, n);
  if (n) rows_of("gather_rows", "x", x, d);
  OpCall c = call_of(ctx, Op::gather_rows, {x, src_row, out});
  c.n = {n, d};
  run(ctx, c);
}

void combine_rows(const Ctx& ctx, const RowBlocks& rows, const Tensor& row, const Tensor& weight,
                  int k, const Tensor& y) {
  if (weight.numel()) check_numel("combine_rows", "weight", weight, row.numel());
  OpCall c = unpermute_call(ctx, Op::combine_rows, row, k, "y", y, {rows.rows, row, weight, y});
  std::vector<const float*> bases;
  RowSource source;
  set_source(ctx, "combine_rows", rows, c, bases, source);
  run(ctx, c);
}

void combine_rows_backward(const Ctx& ctx, const RowBlocks& rows, const Tensor& dy,
                           const Tensor& row, const Tensor& weight, int k, const Tensor& drows,
                           const Tensor& dweight) {
  if (weight.numel()) check_numel("combine_rows_backward", "weight", weight, row.numel());
  check_numel("combine_rows_backward", "dweight", dweight, row.numel());
  OpCall c = unpermute_call(ctx, Op::combine_rows_backward, row, k, "dy", dy,
                            {rows.rows, dy, row, weight, drows, dweight});
  std::vector<const float*> bases;
  RowSource source;
  set_source(ctx, "combine_rows_backward", rows, c, bases, source);
  run(ctx, c);
}

void scatter_add_rows(const Ctx& ctx, const Tensor& drows, const Tensor& row, int k,
                      const Tensor& dx) {
  run(ctx, unpermute_call(ctx, Op::scatter_add_rows, row, k, "dx", dx, {drows, row, dx}));
}

void expert_counts(const Ctx& ctx, const Tensor& expert, const Tensor& counts) {
  check_index(ctx, "expert_counts", "expert", expert, DType::i32);
  check_index(ctx, "expert_counts", "counts", counts, DType::i64);
  OpCall c = call_of(ctx, Op::expert_counts, {expert, counts});
  c.n = {expert.numel(), counts.numel()};
  run(ctx, c);
}

void expert_order(const Ctx& ctx, const Tensor& expert, int k, const Tensor& counts,
                  const Tensor& row_of, const Tensor& send_token) {
  check_index(ctx, "expert_order", "expert", expert, DType::i32);
  check_index(ctx, "expert_order", "counts", counts, DType::i64);
  check_index(ctx, "expert_order", "row_of", row_of, DType::i64);
  check_index(ctx, "expert_order", "send_token", send_token, DType::i64);
  check_numel("expert_order", "row_of", row_of, expert.numel());
  OpCall c = call_of(ctx, Op::expert_order, {expert, counts, row_of, send_token});
  c.n = {expert.numel(), counts.numel(), k};
  run(ctx, c);
}

void router_scores(const Ctx& ctx, const RouterDims& dims, const Tensor& logits,
                   const Tensor& probs, const Tensor& lse) {
  check_numel("router_scores", "logits", logits, dims.T * dims.E);
  check_numel("router_scores", "probs", probs, dims.T * dims.E);
  check_numel("router_scores", "lse", lse, dims.T);
  const RouterArgs args = router_args(dims);
  OpCall c = call_of(ctx, Op::router_scores, {logits, probs, lse});
  c.param = &args;
  run(ctx, c);
}

void router_topk(const Ctx& ctx, const RouterDims& dims, const Tensor& probs, const Tensor& bias,
                 const Tensor& chosen, const Tensor& weight) {
  check_router(ctx, "router_topk", dims, probs, chosen);
  if (bias.numel()) check_numel("router_topk", "bias", bias, dims.E);
  check_numel("router_topk", "weight", weight, dims.T * dims.k);
  const RouterArgs args = router_args(dims);
  OpCall c = call_of(ctx, Op::router_topk, {probs, bias, chosen, weight});
  c.param = &args;
  run(ctx, c);
}

void router_load(const Ctx& ctx, const RouterDims& dims, const Tensor& chosen, const Tensor& sample,
                 const Tensor& stats) {
  check_index(ctx, "router_load", "chosen", chosen, DType::i32);
  check_numel("router_load", "chosen", chosen, dims.T * dims.k);
  check_index(ctx, "router_load", "sample", sample, DType::i32);
  check_numel("router_load", "sample", sample, dims.T);
  check_index(ctx, "router_load", "stats", stats, DType::f64);
  const RouterArgs args = router_args(dims);
  OpCall c = call_of(ctx, Op::router_load, {chosen, sample, stats});
  c.n = {rows_of("router_load", "stats", stats, dims.E + 1)};
  c.param = &args;
  run(ctx, c);
}

void router_frequencies(const Ctx& ctx, const RouterDims& dims, const Tensor& stats,
                        const Tensor& f, const Tensor& inv_tokens) {
  check_index(ctx, "router_frequencies", "stats", stats, DType::f64);
  check_index(ctx, "router_frequencies", "f", f, DType::f64);
  check_index(ctx, "router_frequencies", "inv_tokens", inv_tokens, DType::f64);
  const int64_t n_samples = rows_of("router_frequencies", "stats", stats, dims.E + 1);
  check_numel("router_frequencies", "f", f, n_samples * dims.E);
  check_numel("router_frequencies", "inv_tokens", inv_tokens, n_samples);
  const RouterArgs args = router_args(dims);
  OpCall c = call_of(ctx, Op::router_frequencies, {stats, f, inv_tokens});
  c.n = {n_samples};
  c.param = &args;
  run(ctx, c);
}

namespace {

// The sample statistics of r that the losses and the backward read.
void check_terms(const Ctx& ctx, const char* op, const RouterDims& dims, const RouterTensors& r) {
  check_index(ctx, op, "sample", r.sample, DType::i32);
  check_numel(op, "sample", r.sample, dims.T);
  check_index(ctx, op, "f", r.f, DType::f64);
  check_index(ctx, op, "inv_tokens", r.inv_tokens, DType::f64);
  check_numel(op, "f", r.f, r.inv_tokens.numel() * dims.E);
  check_numel(op, "lse", r.lse, dims.T);
}

}  // namespace

void router_losses(const Ctx& ctx, const RouterDims& dims, const RouterTensors& r,
                   const Tensor& shares) {
  check_numel("router_losses", "probs", r.probs, dims.T * dims.E);
  check_terms(ctx, "router_losses", dims, r);
  check_index(ctx, "router_losses", "shares", shares, DType::f64);
  check_numel("router_losses", "shares", shares, 2);
  const RouterArgs args = router_args(dims, r.aux_coef, r.z_coef);
  OpCall c = call_of(ctx, Op::router_losses, {r.probs, r.lse, r.sample, r.f, r.inv_tokens, shares});
  c.param = &args;
  run(ctx, c);
}

void router_capacity(const Ctx& ctx, const RouterDims& dims, int ranks, int me, const Tensor& token,
                     const Tensor& weight, const Tensor& chosen, int64_t capacity,
                     const Tensor& expert, const Tensor& dropped) {
  const int64_t n = dims.T * dims.k;
  check_index(ctx, "router_capacity", "token", token, DType::i64);
  check_numel("router_capacity", "token", token, ranks * dims.T);
  check_numel("router_capacity", "weight", weight, ranks * n);
  check_index(ctx, "router_capacity", "chosen", chosen, DType::i32);
  check_numel("router_capacity", "chosen", chosen, ranks * n);
  check_index(ctx, "router_capacity", "expert", expert, DType::i32);
  check_numel("router_capacity", "expert", expert, n);
  check_index(ctx, "router_capacity", "dropped", dropped, DType::i64);
  check_numel("router_capacity", "dropped", dropped, 1);
  TRIDENT_CHECK(
      ranks >= 1 && me >= 0 && me < ranks,
      "kernels::router_capacity: rank " + std::to_string(me) + " of " + std::to_string(ranks));
  const RouterArgs args = router_args(dims);
  OpCall c = call_of(ctx, Op::router_capacity, {token, weight, chosen, expert, dropped});
  c.n = {ranks, me, capacity};
  c.param = &args;
  run(ctx, c);
}

void router_backward(const Ctx& ctx, const RouterDims& dims, const RouterTensors& r,
                     const Tensor& dweight, float daux_scale, const Tensor& dlogits) {
  check_numel("router_backward", "logits", r.logits, dims.T * dims.E);
  check_router(ctx, "router_backward", dims, r.probs, r.chosen);
  check_numel("router_backward", "weight", r.weight, dims.T * dims.k);
  check_terms(ctx, "router_backward", dims, r);
  check_numel("router_backward", "dweight", dweight, dims.T * dims.k);
  check_numel("router_backward", "dlogits", dlogits, dims.T * dims.E);
  const RouterArgs args = router_args(dims, r.aux_coef, r.z_coef);
  OpCall c = call_of(ctx, Op::router_backward,
                     {r.logits, r.probs, r.lse, r.chosen, r.weight, r.sample, r.f, r.inv_tokens,
                      dweight, dlogits});
  c.f = daux_scale;
  c.param = &args;
  run(ctx, c);
}

void sum_squares_ranges(const Ctx& ctx, const Tensor& x, const Tensor& ranges, const Tensor& sums) {
  check_index(ctx, "sum_squares_ranges", "ranges", ranges, DType::i64);
  check_index(ctx, "sum_squares_ranges", "sums", sums, DType::f64);
  check_numel("sum_squares_ranges", "ranges", ranges, 2 * sums.numel());
  run(ctx, call_of(ctx, Op::sum_squares_ranges, {x, ranges, sums}));
}

}  // namespace trident::kernels
