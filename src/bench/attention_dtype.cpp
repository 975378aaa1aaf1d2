// `trident bench attention --dtype f32,bf16` (see trident/bench/attention.hpp):
// the attention through the tensor ops on f32 or bf16 tensors, by CPU time.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "trident/bench/attention.hpp"
#include "trident/bench/engine.hpp"
#include "trident/core/error.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::bench {
namespace {

// The tensors of one (shape, dtype) measurement: q, k, v, out and dout of
// the dtype (bf16: as training keeps activations), lse and the gradients f32,
// and the f32 values q, k, v hold for the reference.
struct AttnTensors {
  Tensor q, k, v, out, dout, lse, dq, dk, dv;
  std::vector<float> qv, kv, vv, unused;
};

AttnTensors attn_tensors(const kernels::Ctx& ctx, const kernels::AttnShape& s, DType dt) {
  const std::vector<int64_t> shape = {s.Tq, s.H, s.D};
  AttnTensors t;
  t.q = drawn_tensor(ctx, shape, "bench.attention.q", dt, t.qv);
  t.k = drawn_tensor(ctx, shape, "bench.attention.k", dt, t.kv);
  t.v = drawn_tensor(ctx, shape, "bench.attention.v", dt, t.vv);
  t.dout = drawn_tensor(ctx, shape, "bench.attention.do", dt, t.unused);
  t.out = kernels::empty(ctx, shape, dt);
  t.lse = kernels::empty(ctx, {s.Tq, s.H});
  t.dq = kernels::zeros(ctx, shape);
  t.dk = kernels::zeros(ctx, shape);
  t.dv = kernels::zeros(ctx, shape);
  return t;
}

void forward(const kernels::Ctx& ctx, const kernels::AttnShape& s, const AttnTensors& t) {
  kernels::attention_forward(ctx, s, t.q, t.k, t.v, t.out, t.lse);
}

void forward_backward(const kernels::Ctx& ctx, const kernels::AttnShape& s, const AttnTensors& t) {
  forward(ctx, s, t);
  kernels::attention_backward(ctx, s, t.q, t.k, t.v, t.out, t.lse, t.dout, t.dq, t.dk, t.dv);
}

// The forward's output on query rows 0, Tq/3, Tq/2 + 1, Tq - 1 of the first
// and last head against the fp64 attention of the values q, k, v hold.
SpotCheck check_output(const kernels::Ctx& ctx, const kernels::AttnShape& s, const AttnTensors& t,
                       double tol) {
  SpotCheck check;
  check.tol = tol;
  forward(ctx, s, t);
  Tensor out = kernels::empty(ctx, t.out.shape());
  kernels::convert(ctx, t.out, out);  // bf16 widens exactly
  for (int64_t i : {int64_t(0), s.Tq / 3, s.Tq / 2 + 1, s.Tq - 1})
    for (int h : {0, s.H - 1})
      check_attention_row(check, s, t.qv.data(), t.kv.data(), t.vv.data(), i, h,
                          out.data<float>() + (i * s.H + h) * s.D);
  return check;
}

struct AttnMeasured {
  BestTimes fwd, fb;
  SpotCheck check;
};

AttnMeasured measure_dtype(const kernels::Ctx& ctx, const kernels::AttnShape& s, DType dt,
                           int reps) {
  const AttnTensors t = attn_tensors(ctx, s, dt);
  AttnMeasured m;
  // bf16: the output rounded once and P rounded as the native kernel packs
  // it (2^-9 relative each): 1e-2 in relative L2, gpu.md#bf16's bound
  m.check = check_output(ctx, s, t, dt == DType::f32 ? 1e-4 : 1e-2);
  forward_backward(ctx, s, t);  // warm-up of the backward
  m.fwd = time_best(reps, [&] { forward(ctx, s, t); });
  m.fb = time_best(reps, [&] { forward_backward(ctx, s, t); });
  return m;
}

std::vector<std::string> dtype_notes(const AttentionBenchOptions& o) {
  return {"host: " + cpu_model_name() + "; BLAS: " + kernels::blas_kernels() +
              "; bf16 attention and GEMMs: " + kernels::cpu_bf16_kernels(),
          "through the tensor ops (kernels/functional.hpp); bf16: q, k, v, out and dout bf16 "
          "tensors, lse and dq, dk, dv f32, as in training",
          "FLOPs: forward 4*D per visible (query, key) pair and head, backward 10*D; cpu_: the "
          "calling thread's CPU time, wall_: wall time, each the best of " +
              std::to_string(o.reps) +
              " calls; vs_f32_fwdbwd: the f32 row's fwdbwd_cpu_ms / this row's (f32 measured "
              "whether or not printed)",
          "max_err: worst relative L2 error of 8 spot-checked output rows against the fp64 "
          "attention of the values q, k, v hold (bf16: the rounded inputs); above 1e-4 (f32) "
          "or 1e-2 (bf16) counts in #wrong"};
}

// The rows of one (mask, head_dim, seq): f32 measured always (the ratio's
// base), then one row per dtype asked for.
void add_rows(BenchTable& table, const kernels::Ctx& ctx, const AttentionBenchOptions& o,
              const kernels::AttnShape& s, Verdict& verdict) {
  const double ffwd = kernels::attention_flops(s, false), fbwd = kernels::attention_flops(s, true);
  const AttnMeasured f32 = measure_dtype(ctx, s, DType::f32, o.reps);
  for (const std::string& dt : o.dtypes) {
    const AttnMeasured m = dt == "f32" ? f32 : measure_dtype(ctx, s, DType::bf16, o.reps);
    verdict.add(m.check.wrong);
    table.add_row({std::string(s.causal ? "causal" : "full"), static_cast<long long>(s.Tq),
                   static_cast<long long>(s.D), dt,
                   dt == "f32" ? std::string("f32") : kernels::cpu_bf16_kernels(),
                   m.fwd.cpu_s * 1e3, ffwd / m.fwd.cpu_s / 1e9, m.fb.cpu_s * 1e3,
                   (ffwd + fbwd) / m.fb.cpu_s / 1e9, m.fwd.wall_s * 1e3, m.fb.wall_s * 1e3,
                   f32.fb.cpu_s / m.fb.cpu_s, m.check.worst, m.check.wrong});
  }
}

}  // namespace

int run_attention_dtype_bench(const AttentionBenchOptions& o) {
  if (o.heads < 1) throw InputError("--heads " + std::to_string(o.heads) + ": must be >= 1");
  if (o.threads < 1) throw InputError("--threads " + std::to_string(o.threads) + ": must be >= 1");
  if (o.reps < 1) throw InputError("--reps " + std::to_string(o.reps) + ": must be >= 1");
  for (const std::string& d : o.dtypes)
    if (d != "f32" && d != "bf16")
      throw InputError("--dtype " + d + ": must be f32 or bf16 (comma-separated)");
  kernels::set_blas_threads(o.threads);
  const kernels::DeviceContext host(Device::cpu());
  Verdict verdict("wrong rows in total");
  BenchTable t = TableSpec{"attention_dtype",
                           "CPU flash attention by element type through the tensor ops, " +
                               std::to_string(o.heads) + " heads, " + std::to_string(o.threads) +
                               " BLAS thread(s), best of " + std::to_string(o.reps),
                           {"mask", "seq", "head_dim", "dtype", "path", "fwd_cpu_ms",
                            "fwd_cpu_GFLOP/s", "fwdbwd_cpu_ms", "fwdbwd_cpu_GFLOP/s", "fwd_wall_ms",
                            "fwdbwd_wall_ms", "vs_f32_fwdbwd", "max_err", "#wrong"},
                           dtype_notes(o)}
                     .make();
  for (bool causal : o.causal)
    for (int64_t D : o.head_dims)
      for (int64_t T : o.seqs) {
        add_rows(t, host.ctx(), o, attention_row_shape(o, causal, D, T), verdict);
        std::fprintf(stderr, "  done: %s seq %lld head_dim %lld\n", causal ? "causal" : "full",
                     static_cast<long long>(T), static_cast<long long>(D));
      }
  print_table(t, 0);
  verdict.print(0);
  verdict.print_error(0, "bench attention", "wrong output rows");
  write_report(o.output, {t}, 0, o.command_line);
  return verdict.exit_code();
}

}  // namespace trident::bench
