// `trident bench step` (see trident/bench/step.hpp).
#include "trident/bench/step.hpp"

#include <cmath>
#include <cstdio>
#include <memory>

#include "trident/bench/engine.hpp"
#include "trident/core/error.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/model/flops.hpp"
#include "trident/train/check_config.hpp"
#include "trident/train/trainer.hpp"

namespace trident::bench {
namespace {

// One variant: its config, its trainer and what its timed steps measured.
struct Variant {
  std::string precision;
  std::string bf16_path;  // kernels::set_cpu_bf16_path before each of its steps
  std::unique_ptr<train::Trainer> trainer;
  std::vector<double> cpu_s, wall_s;
  double last_loss = 0;
  long long wrong = 0;  // steps not finite or not applied
};

// --precision's names: train.precision and the CPU bf16 path ("": what
// TRIDENT_CPU_BF16 says, auto by default).
struct PrecisionName {
  const char* name;
  Precision precision;
  const char* bf16_path;
};
constexpr PrecisionName kPrecisions[] = {{"fp32", Precision::fp32, ""},
                                         {"bf16", Precision::bf16, ""},
                                         {"bf16_staged", Precision::bf16, "staged"},
                                         {"bf16_native", Precision::bf16, "native"}};

const PrecisionName& precision_named(const std::string& name) {
  for (const PrecisionName& p : kPrecisions)
    if (name == p.name) return p;
  throw InputError("--precision " + name +
                   ": must be fp32, bf16, bf16_staged or bf16_native (comma-separated)");
}

Config variant_config(const Config& cfg, const std::string& precision) {
  Config c = cfg;
  c.train.precision = precision_named(precision).precision;
  return c;
}

// bench step builds one rank's trainer: a config of more ranks is one line
// naming the rule (not check_config's world-size message).
void check_one_rank(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const long long world =
      cfg.topology ? static_cast<long long>(cfg.topology->nodes) * cfg.topology->devices_per_node
                   : 1;
  if (p.pp == 1 && p.cp == 1 && p.ep == 1 && world == 1) return;
  throw InputError(
      "bench step runs the model on one rank: the config needs parallel.pp, cp and "
      "ep = 1 and topology.nodes x devices_per_node = 1 (it has pp=" +
      std::to_string(p.pp) + " cp=" + std::to_string(p.cp) + " ep=" + std::to_string(p.ep) + ", " +
      std::to_string(world) + " ranks); --set them to 1");
}

// The variant's CPU bf16 path (the --precision name's, rethrown naming it).
void use_path(const Variant& v) {
  try {
    kernels::set_cpu_bf16_path(v.bf16_path);
  } catch (const InputError& e) {
    throw InputError("--precision " + v.precision + ": " + e.what());
  }
}

// The path column: fp32, or the bf16 kernels the variant's steps ran on.
std::string path_of(const Variant& v) {
  if (precision_named(v.precision).precision != Precision::bf16) return "fp32";
  use_path(v);
  return kernels::cpu_bf16_kernels();
}

void check_options(const StepBenchOptions& o) {
  if (o.steps < 1) throw InputError("--steps " + std::to_string(o.steps) + ": must be >= 1");
  if (o.threads < 1) throw InputError("--threads " + std::to_string(o.threads) + ": must be >= 1");
  if (o.precisions.empty())
    throw InputError("--precision: give at least one of fp32, bf16, bf16_staged, bf16_native");
}

// Step `step` of v, timed by process CPU time and wall time when `timed`.
void run_step(Variant& v, int64_t step, bool timed) {
  use_path(v);
  const double w0 = now_s(), c0 = process_cpu_s();
  const train::StepResult r = v.trainer->train_step(step);
  const double c1 = process_cpu_s(), w1 = now_s();
  if (!r.finite || !r.applied || !std::isfinite(r.metrics.loss)) ++v.wrong;
  v.last_loss = r.metrics.loss;
  if (!timed) return;
  v.cpu_s.push_back(c1 - c0);
  v.wall_s.push_back(w1 - w0);
}

std::vector<std::string> table_notes(const StepBenchOptions& o, double flops) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", flops / 1e9);
  return {"host: " + cpu_model_name() + "; BLAS: " + kernels::blas_kernels(),
          "bf16: the CPU bf16 path TRIDENT_CPU_BF16 chooses (auto: native where the CPU has "
          "AVX512-BF16); bf16_staged, bf16_native: that path, chosen before each of the "
          "variant's steps in this process (kernels/blas.hpp, set_cpu_bf16_path); path: the "
          "kernels each ran on",
          "one rank; the variants alternate step by step after one untimed step each; cpu_s: "
          "the process's CPU time per step, wall_s: wall time per step (medians of " +
              std::to_string(o.steps) + " steps)",
          std::string("GFLOP/s: ") + buf +
              " GFLOP per step (model/flops.hpp: 3 x the forward's GEMMs and causal "
              "attention pairs, as trident plan counts) / the step's time; vs_first: the first "
              "variant's cpu_s / this one's",
          "loss_last: the loss of the last step (step " + std::to_string(o.steps) +
              ", 0-based), rel_to_first: |loss - the first variant's| / the first's; #wrong: "
              "steps whose loss or gradient norm was not finite or whose update was skipped"};
}

}  // namespace

int run_step_bench(const Config& cfg, const StepBenchOptions& o) {
  check_options(o);
  check_one_rank(cfg);
  std::vector<Variant> vs;
  for (const std::string& p : o.precisions) {
    const Config c = variant_config(cfg, p);
    train::check_config(c, 1);
    vs.push_back({p, precision_named(p).bf16_path, nullptr, {}, {}, 0, 0});
    if (c.train.precision == Precision::bf16) use_path(vs.back());  // native on a CPU without it
  }
  kernels::set_blas_threads(o.threads);
  for (size_t i = 0; i < vs.size(); ++i) {  // built on its path (bf16 copies or packed weights)
    use_path(vs[i]);
    vs[i].trainer =
        std::make_unique<train::Trainer>(variant_config(cfg, vs[i].precision), train::TrainComms{});
  }
  kernels::set_cpu_bf16_path("");
  for (Variant& v : vs) run_step(v, 0, false);  // first touches of the buffers
  for (int64_t s = 1; s <= o.steps; ++s)
    for (Variant& v : vs) run_step(v, s, true);
  const double flops = model::step_model_flops(cfg, double(vs.front().trainer->samples_per_step()));
  BenchTable t = TableSpec{"step",
                           "Training step of the config's model on one rank (CPU), " +
                               std::to_string(o.threads) + " BLAS thread(s)",
                           {"precision", "path", "steps", "cpu_s", "wall_s", "cpu_GFLOP/s",
                            "wall_GFLOP/s", "vs_first", "loss_last", "rel_to_first", "#wrong"},
                           table_notes(o, flops)}
                     .make();
  Verdict verdict("steps not finite or not applied in total");
  const double first_cpu = median(vs.front().cpu_s), first_loss = vs.front().last_loss;
  for (const Variant& v : vs) {
    const double cpu = median(v.cpu_s), wall = median(v.wall_s);
    verdict.add(v.wrong);
    t.add_row({v.precision, path_of(v), static_cast<long long>(o.steps), cpu, wall,
               flops / cpu / 1e9, flops / wall / 1e9, first_cpu / cpu, v.last_loss,
               std::fabs(v.last_loss - first_loss) / first_loss, v.wrong});
  }
  kernels::set_cpu_bf16_path("");
  print_table(t, 0);
  verdict.print(0);
  verdict.print_error(0, "bench step", "steps not finite or not applied");
  write_report(o.output, {t}, 0, o.command_line);
  return verdict.exit_code();
}

}  // namespace trident::bench
