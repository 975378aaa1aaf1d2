// `trident run CONFIG.toml [--set k=v ...] [--output FILE.h5] [--resume [CKPT]]`:
// the training job. Validates every input before anything is written, maps
// the mesh, trains with a progress line per step on rank 0, writes the run
// file every step, checkpoints every output.checkpoint_every steps, at the
// end, and when SIGUSR1/SIGTERM arrives (all ranks agree at the next step
// boundary, write the checkpoint and exit 0).
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "commands.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"
#include "trident/io/run_file.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/check_config.hpp"
#include "trident/train/checkpointing.hpp"
#include "trident/train/trainer.hpp"

namespace trident::cli {
namespace {

double peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) * 1024.0;
  return 0.0;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

class RunCommand : public Command {
 public:
  explicit RunCommand(CLI::App* app) {
    app->add_option("config", config_, "Config file (TOML)")->required();
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)");
    app->add_option("--output", output_, "Run file (HDF5); default output.file");
    resume_opt_ = app->add_option("--resume", resume_,
                                  "Resume from CKPT, or from the latest checkpoint in "
                                  "output.checkpoint_dir when no file is given")
                      ->expected(0, 1);
  }
  bool needs_mpi() const override { return true; }
  int run() override;

 private:
  std::string config_, output_, resume_;
  std::vector<std::string> sets_;
  CLI::Option* resume_opt_ = nullptr;
};

int RunCommand::run() {
  const int world_size = comm_world_size(), world_rank = comm_world_rank();
  // one BLAS thread per rank: the ranks already share the cores
  kernels::set_blas_threads(1);

  Config cfg = load_config(config_, sets_);
  if (!output_.empty()) cfg.output.file = output_;
  train::check_config(cfg, world_size);
  auto job = world_communicator(cfg.runtime.timeout_s);
  Topology topo = detect_topology(*job, cfg);
  auto comms = build_communicators(*job, cfg, std::move(topo));
  sync_clock(*job);

  train::TrainComms tc;
  tc.world = comms->world.get();
  tc.pp = comms->pp.get();
  tc.cp = comms->cp.get();
  tc.ep = comms->ep.get();
  tc.dpcp = comms->dpcp.get();
  tc.expert_replica = comms->expert_replica.get();
  tc.pp_rank = comms->me.pp;
  tc.pp_size = comms->mesh.pp;
  tc.dp_rank = comms->me.dp;
  tc.dp_size = comms->mesh.dp;
  train::Trainer trainer(cfg, tc);
  train::validate_activation_request(cfg, trainer.samples_per_step());

  // Resume: --resume [CKPT], or automatically after a Slurm requeue.
  int64_t start = 0;
  std::string ckpt;
  const bool slurm_restart = env_int("SLURM_RESTART_COUNT", 0) > 0;
  if (resume_opt_->count() > 0 || slurm_restart) {
    ckpt = resume_.empty() ? latest_checkpoint(cfg.output.checkpoint_dir) : resume_;
    if (ckpt.empty() && resume_opt_->count() > 0)
      throw InputError("--resume: no checkpoint in output.checkpoint_dir '" +
                       cfg.output.checkpoint_dir + "'");
    if (!ckpt.empty()) start = train::load_checkpoint(trainer, ckpt);
    if (start > cfg.train.steps)
      throw InputError("--resume: checkpoint '" + ckpt + "' is at step " + std::to_string(start) +
                       ", past train.steps = " + std::to_string(cfg.train.steps));
  }

  // Every input is valid: now the run file may exist.
  const std::string path = resolve_output_name(cfg.output.file, *job);
  const char* job_id = std::getenv("SLURM_JOB_ID");
  RunFile file(path, *job, cfg, *comms, job_id ? job_id : "");
  file.set_root_attr("command_line", command_line());
  if (!ckpt.empty()) file.set_root_attr("resumed_from", ckpt);
  train::install_stop_signals();
  const bool lead = world_rank == 0;
  if (lead) {
    std::printf(
        "trident run: %s on %d ranks (pp=%d dp=%d cp=%d ep=%d, %s), %lld tokens/step -> %s\n",
        config_.c_str(), world_size, comms->mesh.pp, comms->mesh.dp, comms->mesh.cp, comms->mesh.ep,
        config_name(cfg.parallel.schedule).c_str(),
        static_cast<long long>(trainer.tokens_per_step()), path.c_str());
    if (!ckpt.empty())
      std::printf("resumed from %s at step %lld\n", ckpt.c_str(), static_cast<long long>(start));
    std::fflush(stdout);
  }

  // Test hooks: a real signal (or SIGKILL) raised by one rank at a given step.
  const int hook_rank = env_int("TRIDENT_TEST_RANK", 0);
  const int signal_at = env_int("TRIDENT_TEST_SIGNAL_AT_STEP", -1);
  const int kill_at = env_int("TRIDENT_TEST_KILL_AT_STEP", -1);
  const std::set<int> capture_steps(cfg.output.activation_steps.begin(), cfg.output.activation_steps.end());
  model::CaptureRequest capture;
  capture.layers.insert(cfg.output.activation_layers.begin(), cfg.output.activation_layers.end());
  capture.samples.insert(cfg.output.activation_samples.begin(), cfg.output.activation_samples.end());
  capture.names.insert(cfg.output.activations.begin(), cfg.output.activations.end());

  double first_loss = NAN, last_loss = NAN, total_time = 0, compute_s = 0;
  int64_t steps_run = 0, last_ckpt_step = -1;
  std::string last_ckpt;
  int stopped_by = 0;
  const CommCounters at_start = comm_counters();
  for (int64_t step = start; step < cfg.train.steps; ++step) {
    if (world_rank == hook_rank && step == kill_at) std::raise(SIGKILL);
    const bool cap = capture_steps.count(int(step)) && capture.active();
    train::StepResult r = trainer.train_step(step, cap ? &capture : nullptr);
    const StepMetrics& m = r.metrics;
    file.append_step(m, r.comm_bytes, r.expert_tokens);
    if (cfg.output.timeline) file.append_events(r.events);
    if (cap) train::write_activations(file, cfg, tc.world, step, trainer.positions(), r.captures);
    file.flush();
    if (std::isnan(first_loss)) first_loss = m.loss;
    last_loss = m.loss;
    total_time += m.step_time_s;
    compute_s += r.compute_s;
    ++steps_run;
    if (lead) {
      std::printf("step %5lld | loss %.4f | aux %.4f | lr %.2e | %8.0f tok/s | %.3f s | bubble %4.1f%% "
                  "| comm MB cp %.2f pp %.2f ep %.2f dp %.2f\n",
                  static_cast<long long>(step), m.loss, m.aux_loss, m.lr, m.tokens_per_s,
                  m.step_time_s, 100.0 * m.bubble_fraction, r.comm_bytes[0] / 1e6,
                  r.comm_bytes[1] / 1e6, r.comm_bytes[2] / 1e6, r.comm_bytes[3] / 1e6);
      std::fflush(stdout);
    }
    if (world_rank == hook_rank && step == signal_at) std::raise(SIGUSR1);
    // every rank sees the same decision at the same step boundary
    int stop = train::stop_signal_received();
    tc.world->allreduce_max(&stop, 1);
    const int64_t done = step + 1;
    const bool periodic = cfg.output.checkpoint_every > 0 && done % cfg.output.checkpoint_every == 0;
    if (periodic || stop || done == cfg.train.steps) {
      last_ckpt = train::save_checkpoint(trainer, done);
      last_ckpt_step = done;
    }
    if (stop) {
      stopped_by = stop;
      break;
    }
  }
  if (last_ckpt_step < 0 && start == cfg.train.steps && lead)
    std::printf("nothing to do: the checkpoint is at train.steps = %d\n", cfg.train.steps);

  RankSummary rs;
  rs.rank = world_rank;
  rs.peak_rss_bytes = peak_rss_bytes();
  rs.compute_s = compute_s;
  const CommCounters comm_total = comm_counters() - at_start;
  for (int k = 0; k < 4; ++k) rs.comm_wait_s[k] = comm_total.wait_s[size_t(k)];
  file.write_rank_summaries(rs);
  double peak = rs.peak_rss_bytes;
  tc.world->allreduce_max(&peak, 1);
  // cp and ep waits happen inside F/B (ring, all-to-all); pp and dp waits outside them
  double sums[3] = {compute_s, rs.comm_wait_s[0] + rs.comm_wait_s[2],
                    rs.comm_wait_s[1] + rs.comm_wait_s[3]};
  tc.world->allreduce_sum(sums, 3);
  file.set_root_attr("stopped_by_signal", stopped_by ? std::to_string(stopped_by) : "");
  file.close();
  if (lead) {
    const double denom = total_time * world_size;
    auto pct = [&](double x) { return denom > 0 ? 100.0 * x / denom : 0.0; };
    std::printf("done: %lld steps, loss %.4f -> %.4f, %.0f tokens/s; of rank time: F/B/W %.0f%% "
                "(of which cp+ep wait %.0f%%), pp+dp wait %.0f%%; peak RSS %.0f MB/rank; run file %s\n",
                static_cast<long long>(steps_run), first_loss, last_loss,
                total_time > 0 ? double(trainer.tokens_per_step()) * steps_run / total_time : 0.0,
                pct(sums[0]), pct(sums[1]), pct(sums[2]), peak / 1e6, path.c_str());
    if (!last_ckpt.empty()) std::printf("checkpoint: %s\n", last_ckpt.c_str());
    if (stopped_by)
      std::printf("stopped by signal %d at step %lld: checkpoint written, resume with --resume\n",
                  stopped_by, static_cast<long long>(last_ckpt_step));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

std::unique_ptr<Command> add_run_command(CLI::App& parent) {
  auto* app = parent.add_subcommand("run", "Train the model of CONFIG.toml (under mpirun/srun)");
  return std::make_unique<RunCommand>(app);
}

}  // namespace trident::cli
