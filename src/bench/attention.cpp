// `trident bench attention` (see trident/bench/attention.hpp).
#include "trident/bench/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "trident/bench/engine.hpp"
#include "trident/core/clock.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::bench {

kernels::AttnShape attention_row_shape(const AttentionBenchOptions& o, bool causal, int64_t D,
                                       int64_t T) {
  kernels::AttnShape s;
  s.Tq = s.Tk = T;
  s.H = s.Hkv = o.heads;
  s.D = int(D);
  s.scale = 1.0f / std::sqrt(float(D));
  s.causal = causal;
  return s;
}

namespace {

// f32 normal values from the stream `name`, on ctx's device.
Tensor normal(const kernels::Ctx& ctx, std::vector<int64_t> shape, const char* name) {
  std::vector<float> x(size_t(Tensor::numel_of(shape)));
  rng::fill_normal(x.data(), int64_t(x.size()), rng::hash_name(name), 0, 1.0f);
  return kernels::from_host(ctx, x.data(), std::move(shape), DType::f32);
}

// Square sgemm of size n (the linear layer's, y = x w^T), best of a few: the
// rate the attention is held to.
double sgemm_gflops(const kernels::Ctx& ctx, int64_t n, int reps) {
  const Tensor x = normal(ctx, {n, n}, "bench.sgemm.a"), w = normal(ctx, {n, n}, "bench.sgemm.b");
  const Tensor y = kernels::empty(ctx, {n, n});
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    kernels::linear_forward(ctx, x, w, y);
    best = std::min(best, now_s() - t0);
  }
  return 2.0 * double(n) * n * n / best / 1e9;
}

// Query rows compared with attention_reference_row; returns the largest
// relative L2 error of one output row and counts rows above tol.
double spot_check(const kernels::AttnShape& s, const float* q, const float* k, const float* v,
                  const float* out, double tol, long long* wrong) {
  SpotCheck check;
  check.tol = tol;
  for (int64_t i : {int64_t(0), s.Tq / 3, s.Tq / 2 + 1, s.Tq - 1})
    for (int h : {0, s.H - 1})
      check_attention_row(check, s, q, k, v, i, h, out + (i * s.H + h) * s.D);
  *wrong += check.wrong;
  return check.worst;
}

void check_options(const AttentionBenchOptions& o) {
  if (o.heads < 1) throw InputError("--heads " + std::to_string(o.heads) + ": must be >= 1");
  if (o.threads < 1) throw InputError("--threads " + std::to_string(o.threads) + ": must be >= 1");
  if (o.reps < 1) throw InputError("--reps " + std::to_string(o.reps) + ": must be >= 1");
  if (o.sgemm_n < 64)
    throw InputError("--sgemm-size " + std::to_string(o.sgemm_n) + ": must be >= 64");
}

// One row: forward, backward and forward+backward timed (best of o.reps),
// next to sgemm measured just before; adds its wrong rows to verdict.
std::vector<BenchCell> measure_row(const AttentionBenchOptions& o, bool causal, int64_t D,
                                   int64_t T, Verdict& verdict) {
  const kernels::DeviceContext host(Device::cpu());  // the kernels as training runs them
  const kernels::Ctx& ctx = host.ctx();
  const kernels::AttnShape s = attention_row_shape(o, causal, D, T);
  const std::vector<int64_t> shape = {T, o.heads, D};
  const Tensor q = normal(ctx, shape, "bench.attention.q"),
               k = normal(ctx, shape, "bench.attention.k");
  const Tensor v = normal(ctx, shape, "bench.attention.v"),
               dout = normal(ctx, shape, "bench.attention.do");
  Tensor out(shape), lse({T, int64_t(o.heads)}), dq(shape), dk(shape), dv(shape);

  const double ceiling = sgemm_gflops(ctx, o.sgemm_n, 2);
  double fwd = 1e300, bwd = 1e300, fb = 1e300;
  for (int r = 0; r < o.reps; ++r) {
    dq.zero(), dk.zero(), dv.zero();
    const double t0 = now_s();
    kernels::attention_forward(ctx, s, q, k, v, out, lse);
    const double t1 = now_s();
    kernels::attention_backward(ctx, s, q, k, v, out, lse, dout, dq, dk, dv);
    const double t2 = now_s();
    fwd = std::min(fwd, t1 - t0);
    bwd = std::min(bwd, t2 - t1);
    fb = std::min(fb, t2 - t0);
  }
  long long wrong = 0;
  const double err = spot_check(s, q.ptr(), k.ptr(), v.ptr(), out.ptr(), 1e-4, &wrong);
  verdict.add(wrong);
  const double ffwd = kernels::attention_flops(s, false);
  const double fbwd = kernels::attention_flops(s, true);
  const double fwd_rate = ffwd / fwd / 1e9, fb_rate = (ffwd + fbwd) / fb / 1e9;
  const double bwd_rate = fbwd / bwd / 1e9;
  const size_t ws = std::max(kernels::attention_workspace_bytes(s, false),
                             kernels::attention_workspace_bytes(s, true));
  return {std::string(causal ? "causal" : "full"),
          static_cast<long long>(T),
          static_cast<long long>(D),
          fwd * 1e3,
          fwd_rate,
          fb * 1e3,
          fb_rate,
          ceiling,
          fwd_rate / ceiling,
          bwd_rate / ceiling,
          double(ws) / 1024.0,
          err,
          wrong};
}

}  // namespace

int run_attention_bench(const AttentionBenchOptions& o) {
  check_options(o);
  kernels::set_blas_threads(o.threads);
  Verdict verdict("wrong rows in total");
  BenchTable t =
      TableSpec{
          "attention",
          "CPU flash attention (kernels/cpu/attention.cpp), float32, " + std::to_string(o.heads) +
              " heads, " + std::to_string(o.threads) + " BLAS thread(s), best of " +
              std::to_string(o.reps),
          {"mask", "seq", "head_dim", "fwd_ms", "fwd_GFLOP/s", "fwdbwd_ms", "fwdbwd_GFLOP/s",
           "sgemm_GFLOP/s", "fwd/sgemm", "bwd/sgemm", "workspace_KiB", "max_err", "#wrong"},
          {"FLOPs: forward 4*D per visible (query, key) pair and head, backward 10*D (masked pairs "
           "not counted); fwdbwd_GFLOP/s = (forward + backward FLOPs) / (forward + backward time)",
           "sgemm: " + std::to_string(o.sgemm_n) + "^3 square (linear_forward, x w^T) by " +
               kernels::blas_kernels() +
               ", measured just before each row; fwd/sgemm and bwd/sgemm are the rates "
               "relative to it",
           "workspace: scratch per kernel call (tiles; K and V of one head transposed, and K or "
           "V in panels: D x seq floats each; the backward's delta, seq x heads floats; no seq x "
           "seq buffer); max_err: "
           "worst relative L2 error of 8 spot-checked output rows vs fp64"}}
          .make();
  for (bool causal : o.causal)
    for (int64_t D : o.head_dims)
      for (int64_t T : o.seqs) {
        t.add_row(measure_row(o, causal, D, T, verdict));
        std::fprintf(stderr, "  done: %s seq %lld head_dim %lld\n", causal ? "causal" : "full",
                     static_cast<long long>(T), static_cast<long long>(D));
      }
  std::fputs(t.format().c_str(), stdout);
  verdict.print(0);
  write_report(o.output, {t}, 0, o.command_line);
  return verdict.exit_code();
}

}  // namespace trident::bench
