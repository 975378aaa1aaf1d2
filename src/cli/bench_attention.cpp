// `trident bench attention`: GFLOP/s of the CPU flash-attention kernel,
// forward and forward+backward, next to OpenBLAS sgemm measured just before
// each row in the same process (the practical ceiling, and a guard against a
// machine whose load changes during the run). One process, no MPI.
//
// Every row's forward output is spot-checked against the fp64 definition on
// a few query rows; rows off by more than 1e-4 are counted in #wrong and make
// the exit code 1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "bench_harness.hpp"
#include "commands.hpp"
#include "list_flags.hpp"
#include "trident/comm/comm.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/gemm.hpp"

namespace trident::cli {
namespace {

// Square sgemm of size n, best of a few: the rate the attention is held to.
double sgemm_gflops(const kernels::Ctx& ctx, int64_t n, int reps) {
  std::vector<float> a(size_t(n * n)), b(size_t(n * n)), c(size_t(n * n));
  rng::fill_normal(a.data(), n * n, rng::hash_name("bench.sgemm.a"), 0, 1.0f);
  rng::fill_normal(b.data(), n * n, rng::hash_name("bench.sgemm.b"), 0, 1.0f);
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    kernels::sgemm(ctx, false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, now_s() - t0);
  }
  return 2.0 * double(n) * n * n / best / 1e9;
}

// Query rows compared with attention_reference_row; returns the largest
// relative L2 error of one output row and counts rows above tol.
double spot_check(const kernels::AttnShape& s, const float* q, const float* k, const float* v,
                  const float* out, double tol, long long* wrong) {
  double worst = 0.0;
  std::vector<double> ref(size_t(s.D));
  for (int64_t i : {int64_t(0), s.Tq / 3, s.Tq / 2 + 1, s.Tq - 1}) {
    for (int h : {0, s.H - 1}) {
      kernels::attention_reference_row(s, q, k, v, i, h, ref.data());
      double num = 0, den = 0;
      for (int d = 0; d < s.D; ++d) {
        const double diff = out[(i * s.H + h) * s.D + d] - ref[size_t(d)];
        num += diff * diff;
        den += ref[size_t(d)] * ref[size_t(d)];
      }
      const double err = std::sqrt(num / std::max(den, 1e-30));
      worst = std::max(worst, err);
      if (!(err <= tol)) ++*wrong;
    }
  }
  return worst;
}

class BenchAttentionCommand : public Command {
 public:
  explicit BenchAttentionCommand(CLI::App* app) {
    app->add_option("--seq", seq_, "Sequence lengths, comma-separated");
    app->add_option("--head-dim", head_dim_, "Head dimensions, comma-separated");
    app->add_option("--heads", heads_, "Query heads (= kv heads)");
    app->add_option("--mask", masks_, "Masks to measure, comma-separated: full,causal");
    app->add_option("--threads", threads_, "BLAS threads");
    app->add_option("--reps", reps_, "Timed repetitions per row (best is reported)");
    app->add_option("--sgemm-size", sgemm_n_, "Square sgemm size for the ceiling");
    app->add_option("--output", output_, "Write the table to this HDF5 file");
  }

  bool needs_mpi() const override { return false; }

  int run() override;

 private:
  std::vector<bool> check_flags() const;
  // One row: forward, backward and forward+backward timed (best of --reps),
  // next to sgemm measured just before; adds its wrong rows to total_wrong_.
  std::vector<BenchCell> measure_row(bool causal, int64_t D, int64_t T);

  long long total_wrong_ = 0;

  std::string seq_ = "1024,2048,4096,8192";
  std::string head_dim_ = "64,128";
  std::string masks_ = "full,causal";
  int heads_ = 1;
  int threads_ = 1;
  int reps_ = 1;
  int64_t sgemm_n_ = 2048;
  std::string output_;
};

std::vector<bool> BenchAttentionCommand::check_flags() const {
  std::vector<bool> causal_list;
  for (const std::string& m : split_list("--mask", masks_)) {
    if (m != "full" && m != "causal")
      throw InputError("--mask " + masks_ + ": '" + m + "' must be full or causal");
    causal_list.push_back(m == "causal");
  }
  if (heads_ < 1) throw InputError("--heads " + std::to_string(heads_) + ": must be >= 1");
  if (threads_ < 1) throw InputError("--threads " + std::to_string(threads_) + ": must be >= 1");
  if (reps_ < 1) throw InputError("--reps " + std::to_string(reps_) + ": must be >= 1");
  if (sgemm_n_ < 64)
    throw InputError("--sgemm-size " + std::to_string(sgemm_n_) + ": must be >= 64");
  return causal_list;
}

std::vector<BenchCell> BenchAttentionCommand::measure_row(bool causal, int64_t D, int64_t T) {
  const kernels::DeviceContext host(Device::cpu());  // the kernels as training runs them
  const kernels::Ctx& ctx = host.ctx();
  kernels::AttnShape s;
  s.Tq = s.Tk = T;
  s.H = s.Hkv = heads_;
  s.D = int(D);
  s.scale = 1.0f / std::sqrt(float(D));
  s.causal = causal;
  const int64_t n = T * heads_ * D;
  const size_t un = static_cast<size_t>(n);
  std::vector<float> q(un), k(un), v(un), dout(un);
  rng::fill_normal(q.data(), n, rng::hash_name("bench.attention.q"), 0, 1.0f);
  rng::fill_normal(k.data(), n, rng::hash_name("bench.attention.k"), 0, 1.0f);
  rng::fill_normal(v.data(), n, rng::hash_name("bench.attention.v"), 0, 1.0f);
  rng::fill_normal(dout.data(), n, rng::hash_name("bench.attention.do"), 0, 1.0f);
  std::vector<float> out(un), lse(static_cast<size_t>(T * heads_)), dq(un), dk(un), dv(un);

  const double ceiling = sgemm_gflops(ctx, sgemm_n_, 2);
  double fwd = 1e300, bwd = 1e300, fb = 1e300;
  for (int r = 0; r < reps_; ++r) {
    std::fill(dq.begin(), dq.end(), 0.0f);
    std::fill(dk.begin(), dk.end(), 0.0f);
    std::fill(dv.begin(), dv.end(), 0.0f);
    const double t0 = now_s();
    kernels::attention_forward(ctx, s, q.data(), k.data(), v.data(), out.data(), lse.data());
    const double t1 = now_s();
    kernels::attention_backward(ctx, s, q.data(), k.data(), v.data(), out.data(), lse.data(),
                                dout.data(), dq.data(), dk.data(), dv.data());
    const double t2 = now_s();
    fwd = std::min(fwd, t1 - t0);
    bwd = std::min(bwd, t2 - t1);
    fb = std::min(fb, t2 - t0);
  }
  long long wrong = 0;
  const double err = spot_check(s, q.data(), k.data(), v.data(), out.data(), 1e-4, &wrong);
  total_wrong_ += wrong;
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

int BenchAttentionCommand::run() {
  const auto seqs = parse_positive_list("--seq", seq_);
  const auto dims = parse_positive_list("--head-dim", head_dim_);
  const std::vector<bool> causal_list = check_flags();
  kernels::set_blas_threads(threads_);
  BenchTable t =
      TableSpec{
          "attention",
          "CPU flash attention (kernels/cpu/attention.cpp), float32, " + std::to_string(heads_) +
              " heads, " + std::to_string(threads_) + " BLAS thread(s), best of " +
              std::to_string(reps_),
          {"mask", "seq", "head_dim", "fwd_ms", "fwd_GFLOP/s", "fwdbwd_ms", "fwdbwd_GFLOP/s",
           "sgemm_GFLOP/s", "fwd/sgemm", "bwd/sgemm", "workspace_KiB", "max_err", "#wrong"},
          {"FLOPs: forward 4*D per visible (query, key) pair and head, backward 10*D (masked pairs "
           "not counted); fwdbwd_GFLOP/s = (forward + backward FLOPs) / (forward + backward time)",
           "sgemm: " + std::to_string(sgemm_n_) + "^3 square by " + kernels::blas_kernels() +
               ", measured just before each row; fwd/sgemm and bwd/sgemm are the rates "
               "relative to it",
           "workspace: scratch per kernel call (tiles; K and V of one head transposed, and K or "
           "V in panels: D x seq floats each; the backward's delta, seq x heads floats; no seq x "
           "seq buffer); max_err: "
           "worst relative L2 error of 8 spot-checked output rows vs fp64"}}
          .make();
  for (bool causal : causal_list)
    for (int64_t D : dims)
      for (int64_t T : seqs) {
        t.add_row(measure_row(causal, D, T));
        std::fprintf(stderr, "  done: %s seq %lld head_dim %lld\n", causal ? "causal" : "full",
                     static_cast<long long>(T), static_cast<long long>(D));
      }
  std::fputs(t.format().c_str(), stdout);
  std::printf("# wrong rows in total: %lld (%s)\n", total_wrong_, total_wrong_ ? "FAILED" : "OK");
  std::fflush(stdout);
  if (!output_.empty()) write_bench_file(output_, {t}, command_line());
  return total_wrong_ ? 1 : 0;
}

}  // namespace

std::unique_ptr<Command> add_bench_attention(CLI::App& parent) {
  auto* app =
      parent.add_subcommand("attention", "CPU attention kernel GFLOP/s next to sgemm (one rank)");
  return std::make_unique<BenchAttentionCommand>(app);
}
}  // namespace trident::cli
