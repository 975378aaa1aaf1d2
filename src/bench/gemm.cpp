// `trident bench gemm` (see trident/bench/gemm.hpp).
#include "trident/bench/gemm.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "trident/bench/engine.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::bench {
namespace {

// One linear layer y[T, out] = x[T, in] w[out, in]^T (the names of the
// layers of that shape).
struct LinearShape {
  std::string name;
  int64_t T = 0, in = 0, out = 0;
};

enum class GemmOp { forward, input_grad, weight_grad };
constexpr const char* kOpNames[] = {"forward", "input_grad", "weight_grad"};

// One op of a layer as C[M, N] = sum_k A(i, k) B(j, k): the stored shapes of
// its operands a, b and output c, and the strides that read A(i, k) =
// a[i * ai + k * ak], B(j, k) = b[j * bj + k * bk].
struct GemmForm {
  int64_t M = 0, N = 0, K = 0;
  std::vector<int64_t> a_shape, b_shape, c_shape;
  int64_t ai = 0, ak = 0, bj = 0, bk = 0;
};

GemmForm form_of(GemmOp op, const LinearShape& s) {
  const int64_t T = s.T, in = s.in, out = s.out;
  switch (op) {
    case GemmOp::forward:  // y = x w^T: a = x [T, in], b = w [out, in]
      return {T, out, in, {T, in}, {out, in}, {T, out}, in, 1, in, 1};
    case GemmOp::input_grad:  // dx = dy w: a = dy [T, out], b = w [out, in]
      return {T, in, out, {T, out}, {out, in}, {T, in}, out, 1, 1, in};
    case GemmOp::weight_grad:  // dw += dy^T x: a = dy [T, out], b = x [T, in]
      return {out, in, T, {T, out}, {T, in}, {out, in}, 1, out, 1, in};
  }
  return {};
}

// The layers of cfg's model at T rows (experts: their average routed rows),
// one entry per distinct shape.
std::vector<LinearShape> model_shapes(const ModelConfig& m, int64_t T) {
  const int64_t d = m.d_model, hq = int64_t(m.n_heads) * m.head_dim(),
                hkv = int64_t(m.n_kv_heads) * m.head_dim();
  std::vector<LinearShape> all = {{"wq", T, d, hq}, {"wk,wv", T, d, hkv}, {"wo", T, hq, d}};
  bool dense = false, moe = false;
  for (int l = 0; l < m.n_layers; ++l) (m.is_moe_layer(l) ? moe : dense) = true;
  if (dense) {
    all.push_back({"ffn gate,up", T, d, m.ffn_hidden});
    all.push_back({"ffn down", T, m.ffn_hidden, d});
  }
  if (moe) {
    const int64_t rows = std::max<int64_t>(1, T * m.top_k / m.n_experts);
    all.push_back({"expert gate,up", rows, d, m.expert_ffn_hidden()});
    all.push_back({"expert down", rows, m.expert_ffn_hidden(), d});
  }
  all.push_back({"lm_head", T, d, m.vocab_size});
  std::vector<LinearShape> out;
  for (const LinearShape& s : all) {
    auto same = std::find_if(out.begin(), out.end(), [&](const LinearShape& o) {
      return o.T == s.T && o.in == s.in && o.out == s.out;
    });
    if (same == out.end())
      out.push_back(s);
    else
      same->name += "," + s.name;
  }
  return out;
}

// The cases the flags ask for; InputError naming the flag otherwise.
std::vector<LinearShape> cases_of(const Config& cfg, const GemmBenchOptions& o) {
  if (o.reps < 1) throw InputError("--reps " + std::to_string(o.reps) + ": must be >= 1");
  if (o.threads < 1) throw InputError("--threads " + std::to_string(o.threads) + ": must be >= 1");
  if (o.tokens < 0) throw InputError("--tokens " + std::to_string(o.tokens) + ": must be >= 1");
  if (o.tokens && !o.use_config)
    throw InputError("--tokens " + std::to_string(o.tokens) +
                     ": needs a config (the model's shapes)");
  for (const std::string& d : o.dtypes)
    if (d != "f32" && d != "bf16")
      throw InputError("--dtype " + d + ": must be f32 or bf16 (comma-separated)");
  for (const std::string& op : o.ops)
    if (std::find(std::begin(kOpNames), std::end(kOpNames), op) == std::end(kOpNames))
      throw InputError("--ops " + op + ": must be forward, input_grad or weight_grad");
  std::vector<LinearShape> cases;
  if (o.use_config) {
    const int64_t T =
        o.tokens ? o.tokens : int64_t(cfg.data.micro_batch_size) * int64_t(cfg.data.seq_len);
    cases = model_shapes(cfg.model, T);
  }
  for (int64_t n : o.sizes) cases.push_back({std::to_string(n) + "^3", n, n, n});
  if (cases.empty()) throw InputError("--sizes: no cases (give a config, square sizes or both)");
  return cases;
}

// The operands of one (op, dtype) measurement on the host, and the f32
// values they hold (bf16: the rounded inputs, widened exactly).
struct Operands {
  Tensor a, b, c;
  std::vector<float> a_val, b_val;
};

Operands operands(const kernels::Ctx& ctx, const GemmForm& f, DType dtype) {
  Operands o;
  o.a = drawn_tensor(ctx, f.a_shape, "bench.gemm.a", dtype, o.a_val);
  o.b = drawn_tensor(ctx, f.b_shape, "bench.gemm.b", dtype, o.b_val);
  o.c = kernels::zeros(ctx, f.c_shape);
  return o;
}

void run_op(const kernels::Ctx& ctx, GemmOp op, const Operands& o) {
  switch (op) {
    case GemmOp::forward:
      return kernels::linear_forward(ctx, o.a, o.b, o.c);
    case GemmOp::input_grad:
      return kernels::linear_backward_input(ctx, o.a, o.b, o.c);
    case GemmOp::weight_grad:
      return kernels::linear_backward_weight(ctx, o.a, o.b, o.c);
  }
}

// Output rows 0, M/3, M/2 + 1 and M - 1 against the fp64 sums of the values
// the operands hold.
SpotCheck check_rows(const GemmForm& f, const Operands& o, double tol) {
  SpotCheck check;
  check.tol = tol;
  std::vector<int64_t> rows = {0, f.M / 3, std::min(f.M - 1, f.M / 2 + 1), f.M - 1};
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<double> ref(size_t(f.N));
  for (int64_t i : rows) {
    for (int64_t j = 0; j < f.N; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < f.K; ++k)
        sum += double(o.a_val[size_t(i * f.ai + k * f.ak)]) *
               double(o.b_val[size_t(j * f.bj + k * f.bk)]);
      ref[size_t(j)] = sum;
    }
    check.add(o.c.data<float>() + i * f.N, ref.data(), f.N);
  }
  return check;
}

struct Measured {
  BestTimes t;
  SpotCheck check;
};

// Checked once on fresh operands (the warm-up), then timed on the same.
Measured measure(const kernels::Ctx& ctx, GemmOp op, const GemmForm& f, DType dtype, int reps) {
  const Operands o = operands(ctx, f, dtype);
  run_op(ctx, op, o);
  Measured m;
  m.check = check_rows(f, o, 1e-4);
  m.t = time_best(reps, [&] { run_op(ctx, op, o); });
  return m;
}

// The host, its caches and the fp32 GEMMs' parameters, as printed above the
// tables and kept in their notes.
std::string host_line() {
  return "host: " + kernels::cpu_gemm_host() + "; BLAS: " + kernels::blas_kernels();
}
std::string params_line() {
  return std::string("fp32 GEMM parameters: ") + kernels::cpu_gemm_params() +
         (kernels::cpu_gemm_params_derived() ? " (derived from the caches)"
                                             : " (TRIDENT_CPU_GEMM_BLOCKS)");
}

std::vector<std::string> table_notes(const GemmBenchOptions& o) {
  return {host_line() + "; bf16 GEMMs: " + kernels::cpu_bf16_kernels(),
          params_line(),
          "f32: the f32 linear op training runs (trident's direct GEMM where both operands fit "
          "the parameters' direct bytes on an AVX-512 host, else the BLAS's sgemm); bf16: operands "
          "a and b bf16 "
          "tensors, the output f32 (the weight gradient's dtype in training)",
          "ops: forward y[T,out] = x w^T (M T, N out, K in); input_grad dx = dy w (M T, N in, "
          "K out); weight_grad dw += dy^T x (M out, N in, K T)",
          "GFLOP/s = 2 M N K / the best of " + std::to_string(o.reps) +
              " calls' wall (wall_) or thread CPU (cpu_) time; vs_f32_cpu: cpu_GFLOP/s / the f32 "
              "row's of the same shape and op (measured whether or not f32 is printed)",
          "max_err: worst relative L2 error of the spot-checked output rows (0, M/3, M/2+1, "
          "M-1) against the fp64 sum of the values the operands hold (bf16: the rounded "
          "inputs); above 1e-4 counts in #wrong"};
}

// --sweep's variants of one op: sgemm alone (direct=0), the parameters in
// use, then trident's own kernel forced (direct and kc beyond any operand)
// with one parameter moved at a time: nt_rows for the forward (its panel is
// prefetched by rows of A), the prefetch distance and the row block for the
// backward's two GEMMs (B read by rows).
struct SweepVariant {
  std::string label, text;
};
std::vector<SweepVariant> sweep_variants(GemmOp op) {
  const std::string own = "direct=4096M,kc=65536";
  std::vector<SweepVariant> v = {{"sgemm", "direct=0"}, {"in use", ""}, {"own", own}};
  const auto add = [&](const char* key, std::initializer_list<int> values) {
    for (int x : values) {
      const std::string kv = std::string(key) + "=" + std::to_string(x);
      v.push_back({"own " + kv, own + "," + kv});
    }
  };
  if (op == GemmOp::forward) {
    add("nt_rows", {8, 16, 32, 64});
  } else {
    add("prefetch", {0, 4, 8, 12, 16, 24});
    add("mc", {64, 128, 256, 512});
  }
  return v;
}

struct SweepTables {
  BenchTable all, best;
};

SweepTables sweep_tables(const GemmBenchOptions& o) {
  const std::vector<std::string> all = table_notes(o);
  // the host, the parameters and the ops of bench gemm's notes (not its bf16 ones)
  std::vector<std::string> notes = {all[0], all[1], all[3]};
  notes.push_back(
      "cpu_GFLOP/s = 2 M N K / the best of " + std::to_string(o.reps) +
      " calls' thread CPU time; max_err: as bench gemm's (above 1e-4 counts in #wrong)");
  notes.push_back(
      "variants: sgemm = direct=0 (the BLAS for every shape); in use = the parameters above; own "
      "= trident's kernel forced (direct=4096M,kc=65536) with one key moved; vs_sgemm: "
      "cpu_GFLOP/s / the sgemm row's (cpu-kernels.md#host-parameters)");
  const std::string threads =
      std::to_string(o.threads) + " BLAS thread(s), best of " + std::to_string(o.reps);
  return {TableSpec{"gemm_sweep",
                    "f32 GEMM parameters swept per layer and op, " + threads,
                    {"layer", "op", "M", "N", "K", "variant", "params", "cpu_ms", "cpu_GFLOP/s",
                     "vs_sgemm", "max_err", "#wrong"},
                    notes}
              .make(),
          TableSpec{"gemm_sweep_best",
                    "The fastest variant per layer and op against sgemm and the parameters in use",
                    {"layer", "op", "M", "N", "K", "fastest", "params", "cpu_GFLOP/s", "vs_sgemm",
                     "in_use_vs_sgemm", "vs_in_use"},
                    notes}
              .make()};
}

// Every variant of one layer's op measured (on fresh operands, checked), its
// rows added to t.all and the fastest to t.best.
void sweep_op(const kernels::Ctx& ctx, const LinearShape& s, GemmOp op, const GemmBenchOptions& o,
              SweepTables& t, Verdict& verdict) {
  const GemmForm f = form_of(op, s);
  const double flop = 2.0 * double(f.M) * double(f.N) * double(f.K);
  const char* op_name = kOpNames[int(op)];
  double sgemm_rate = 0, in_use_rate = 0, best_rate = 0;
  std::string best_label, best_params;
  for (const SweepVariant& v : sweep_variants(op)) {
    kernels::set_cpu_gemm_params(v.text);
    const Measured m = measure(ctx, op, f, DType::f32, o.reps);
    const double rate = flop / m.t.cpu_s / 1e9;
    if (v.label == "sgemm") sgemm_rate = rate;
    if (v.label == "in use") in_use_rate = rate;
    if (rate > best_rate) {
      best_rate = rate;
      best_label = v.label;
      best_params = kernels::cpu_gemm_params();
    }
    verdict.add(m.check.wrong);
    t.all.add_row({s.name, op_name, static_cast<long long>(f.M), static_cast<long long>(f.N),
                   static_cast<long long>(f.K), v.label, kernels::cpu_gemm_params(),
                   m.t.cpu_s * 1e3, rate, rate / sgemm_rate, m.check.worst, m.check.wrong});
  }
  kernels::set_cpu_gemm_params("");
  t.best.add_row({s.name, op_name, static_cast<long long>(f.M), static_cast<long long>(f.N),
                  static_cast<long long>(f.K), best_label, best_params, best_rate,
                  best_rate / sgemm_rate, in_use_rate / sgemm_rate, best_rate / in_use_rate});
}

int run_sweep(const kernels::Ctx& ctx, const std::vector<LinearShape>& cases,
              const GemmBenchOptions& o) {
  Verdict verdict("wrong rows in total");
  SweepTables t = sweep_tables(o);
  for (const LinearShape& s : cases)
    for (const std::string& op_name : o.ops) {
      const auto op = GemmOp(std::find(std::begin(kOpNames), std::end(kOpNames), op_name) -
                             std::begin(kOpNames));
      sweep_op(ctx, s, op, o, t, verdict);
      std::fprintf(stderr, "  swept: %s %s\n", s.name.c_str(), op_name.c_str());
    }
  print_table(t.all, 0);
  print_table(t.best, 0);
  verdict.print(0);
  verdict.print_error(0, "bench gemm --sweep", "wrong output rows");
  write_report(o.output, {t.all, t.best}, 0, o.command_line);
  return verdict.exit_code();
}

}  // namespace

int run_gemm_bench(const Config& cfg, const GemmBenchOptions& o) {
  const std::vector<LinearShape> cases = cases_of(cfg, o);
  kernels::set_blas_threads(o.threads);
  // TRIDENT_CPU_GEMM_BLOCKS read now: a bad value is one line and exit 2
  std::printf("# %s\n# %s\n", host_line().c_str(), params_line().c_str());
  const kernels::DeviceContext host(Device::cpu());
  const kernels::Ctx& ctx = host.ctx();
  if (o.sweep) return run_sweep(ctx, cases, o);
  Verdict verdict("wrong rows in total");
  BenchTable t =
      TableSpec{"gemm",
                "GEMMs of the linear layers through the tensor ops (CPU), " +
                    std::to_string(o.threads) + " BLAS thread(s), best of " +
                    std::to_string(o.reps),
                {"layer", "op", "M", "N", "K", "dtype", "path", "wall_ms", "wall_GFLOP/s", "cpu_ms",
                 "cpu_GFLOP/s", "vs_f32_cpu", "max_err", "#wrong"},
                table_notes(o)}
          .make();
  const std::string bf16_path = kernels::cpu_bf16_kernels();
  for (const LinearShape& s : cases)
    for (const std::string& op_name : o.ops) {
      const auto op = GemmOp(std::find(std::begin(kOpNames), std::end(kOpNames), op_name) -
                             std::begin(kOpNames));
      const GemmForm f = form_of(op, s);
      const double flop = 2.0 * double(f.M) * double(f.N) * double(f.K);
      const Measured f32 = measure(ctx, op, f, DType::f32, o.reps);
      for (const std::string& dt : o.dtypes) {
        const Measured m = dt == "f32" ? f32 : measure(ctx, op, f, DType::bf16, o.reps);
        verdict.add(m.check.wrong);
        t.add_row({s.name, op_name, static_cast<long long>(f.M), static_cast<long long>(f.N),
                   static_cast<long long>(f.K), dt, dt == "f32" ? std::string("f32") : bf16_path,
                   m.t.wall_s * 1e3, flop / m.t.wall_s / 1e9, m.t.cpu_s * 1e3,
                   flop / m.t.cpu_s / 1e9, f32.t.cpu_s / m.t.cpu_s, m.check.worst, m.check.wrong});
      }
      std::fprintf(stderr, "  done: %s %s\n", s.name.c_str(), op_name.c_str());
    }
  print_table(t, 0);
  verdict.print(0);
  verdict.print_error(0, "bench gemm", "wrong output rows");
  write_report(o.output, {t}, 0, o.command_line);
  return verdict.exit_code();
}

}  // namespace trident::bench
