// The training job (see train/run.hpp): resume, run file, the step loop with
// its checkpoint cadence and stop-signal consensus, and the closing summary.
#include "trident/train/run.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "trident/comm/flight_recorder.hpp"
#include "trident/core/allocator.hpp"
#include "trident/core/clock.hpp"
#include "trident/core/error.hpp"
#include "trident/io/checkpoint.hpp"
#include "trident/io/run_file.hpp"
#include "trident/io/sharded_checkpoint.hpp"
#include "trident/kernels/staging.hpp"
#include "trident/train/checkpoint_saver.hpp"
#include "trident/train/checkpointing.hpp"
#include "trident/train/local_tier.hpp"
#include "trident/train/step_guard.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {
namespace {

// Steps whose packed sequences /data/packed_lengths counts.
constexpr int64_t kPieceSteps = 8;

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

// The run file's `backend`: the device type the kernels ran on.
const char* backend_name(Device d) {
  switch (d.type) {
    case DeviceType::cpu:
      return "cpu";
    case DeviceType::cuda:
      return "cuda";
    case DeviceType::emulated:
      return "emulated";
  }
  return "?";
}

}  // namespace

TrainComms train_comms(const Communicators& c) {
  TrainComms tc;
  tc.world = c.world.get();
  tc.pp = c.pp.get();
  tc.cp = c.cp.get();
  tc.ep = c.ep.get();
  tc.dpcp = c.dpcp.get();
  tc.expert_replica = c.expert_replica.get();
  tc.pp_rank = c.me.pp;
  tc.pp_size = c.mesh.pp;
  tc.dp_rank = c.me.dp;
  tc.dp_size = c.mesh.dp;
  tc.local_rank = c.topo.ranks.at(size_t(c.world->rank())).local_rank;
  return tc;
}

namespace {

// Where the run starts: --resume [CKPT], or the latest checkpoint after a
// Slurm requeue (none yet: from the start).
struct ResumePoint {
  int64_t step = 0;
  std::string checkpoint;
  std::string tier;  // "local" (output.local_checkpoint_dir) or "shared" ("" : from the start)
};

// What started the resume, for its messages: the flag the user gave, or
// Slurm restarting a requeued job.
std::string resume_trigger(const RunRequest& req) {
  if (req.resume) return "--resume";
  if (env_int("TRIDENT_RESTART_ATTEMPT", 0) > 0)
    return "restart inside the allocation, attempt " +
           std::to_string(env_int("TRIDENT_RESTART_ATTEMPT", 0));
  return "Slurm restart, SLURM_RESTART_COUNT=" + std::to_string(env_int("SLURM_RESTART_COUNT", 0));
}

// Loads `path` on every rank; the ranks agree on the outcome, so a file that
// is damaged where only some ranks read ends every rank with that reason
// (its first reporter's) at once. Returns "" or the reason.
std::string load_everywhere(Trainer& trainer, const std::string& path, int64_t& step) {
  std::string why;
  try {
    step = load_checkpoint(trainer, path);
  } catch (const InputError& e) {
    why = e.what();
  }
  return agree_on_check(*trainer.comms().world, why.empty(), why).message;
}

// Saves newer than every complete checkpoint that left shards and no index
// (a job killed during a save): named, so the user sees why they are passed over.
void say_unindexed(const std::string& dir, const std::string& listed, const std::string& trigger,
                   bool lead) {
  if (!lead) return;
  const std::string newest = listed.substr(0, listed.find('\n'));
  const int64_t newest_step = newest.empty() ? -1 : checkpoint_step(newest);
  for (int64_t step : unindexed_steps(dir))
    if (step > newest_step)
      std::fprintf(stderr,
                   "trident: warning: not resuming from step %lld (%s): %s has shards and no "
                   "index (a save that did not complete)\n",
                   static_cast<long long>(step), trigger.c_str(),
                   checkpoint_path(dir, step).c_str());
}

// The newest checkpoint in output.checkpoint_dir that loads on every rank;
// damaged ones are named on stderr and passed over ("" if none is there).
std::string resume_latest(const Config& cfg, Trainer& trainer, const std::string& trigger,
                          int64_t& step) {
  Communicator& world = *trainer.comms().world;
  std::string listed;  // rank 0's view of the directory, for every rank
  for (const auto& p : checkpoints_newest_first(cfg.output.checkpoint_dir)) listed += p + "\n";
  listed = broadcast_string(world, listed, 0);
  say_unindexed(cfg.output.checkpoint_dir, listed, trigger, world.rank() == 0);
  std::vector<std::string> skipped;
  for (size_t a = 0, b; (b = listed.find('\n', a)) != std::string::npos; a = b + 1) {
    const std::string path = listed.substr(a, b - a);
    const std::string why = load_everywhere(trainer, path, step);
    if (why.empty()) return path;
    if (world.rank() == 0)
      std::fprintf(stderr, "trident: warning: not resuming from %s (%s): %s\n", path.c_str(),
                   trigger.c_str(), why.c_str());
    skipped.push_back(path);
  }
  if (!skipped.empty())
    throw InputError(trigger + ": no checkpoint in output.checkpoint_dir '" +
                     cfg.output.checkpoint_dir + "' loads (" + std::to_string(skipped.size()) +
                     " damaged, see the warnings above)");
  return "";
}

// The node-local tier (output.local_checkpoint_dir): its newest step complete
// across the nodes that are left, when newer than the checkpoint
// directory's newest; the missing shards are copied from their partner
// copies first. False (and one line saying why) when there is none or it
// does not load: the shared checkpoint directory then.
bool resume_local(const Config& cfg, Trainer& trainer, const std::vector<std::string>& hosts,
                  const std::string& trigger, ResumePoint& at) {
  if (cfg.output.local_checkpoint_dir.empty()) return false;
  Communicator& world = *trainer.comms().world;
  int64_t shared_step = -1;
  if (world.rank() == 0) {
    const std::vector<std::string> shared = checkpoints_newest_first(cfg.output.checkpoint_dir);
    if (!shared.empty()) shared_step = checkpoint_step(shared.front());
  }
  world.broadcast(&shared_step, sizeof shared_step, 0);
  const std::string dir = local_node_dir(cfg.output, hosts.at(size_t(world.rank())));
  std::string why;
  const std::string path = restore_local(
      world, dir, shared_step,
      [&trainer](const std::string& index) { return checkpoint_shards_read(trainer, index); }, why);
  const bool lead = world.rank() == 0;
  if (path.empty()) {
    if (lead)
      std::fprintf(stderr,
                   "trident: warning: %s: not resuming from the local tier (%s); resuming from the "
                   "shared checkpoint directory %s\n",
                   trigger.c_str(), why.c_str(), cfg.output.checkpoint_dir.c_str());
    return false;
  }
  const std::string bad = load_everywhere(trainer, path, at.step);
  if (!bad.empty()) {
    if (lead)
      std::fprintf(stderr,
                   "trident: warning: %s: not resuming from the local tier: %s; resuming from the "
                   "shared checkpoint directory %s\n",
                   trigger.c_str(), bad.c_str(), cfg.output.checkpoint_dir.c_str());
    return false;
  }
  if (lead)
    std::printf(
        "resuming from the local tier: step %lld, complete across the nodes left (%s; "
        "the shared checkpoint directory's newest is step %lld)\n",
        static_cast<long long>(at.step), why.c_str(), static_cast<long long>(shared_step));
  at.checkpoint = path;
  at.tier = "local";
  return true;
}

ResumePoint resume_point(const Config& cfg, const RunRequest& req, Trainer& trainer,
                         const std::vector<std::string>& hosts) {
  ResumePoint at;
  // a requeued job, or slurm/trident.sbatch's restart of its step on a spare
  const bool slurm_restart =
      env_int("SLURM_RESTART_COUNT", 0) > 0 || env_int("TRIDENT_RESTART_ATTEMPT", 0) > 0;
  if (!req.resume && !slurm_restart) return at;
  const std::string trigger = resume_trigger(req);
  if (!req.resume_from.empty()) {
    at.checkpoint = req.resume_from;
    const std::string why = load_everywhere(trainer, at.checkpoint, at.step);
    if (!why.empty()) throw InputError(trigger + ": " + why);
  } else if (!resume_local(cfg, trainer, hosts, trigger, at)) {
    at.checkpoint = resume_latest(cfg, trainer, trigger, at.step);
  }
  if (at.tier.empty() && !at.checkpoint.empty()) at.tier = "shared";
  if (at.checkpoint.empty() && req.resume)
    throw InputError("--resume: no checkpoint in output.checkpoint_dir '" +
                     cfg.output.checkpoint_dir + "'");
  if (at.step > cfg.train.steps)
    throw InputError(trigger + ": checkpoint '" + at.checkpoint + "' is at step " +
                     std::to_string(at.step) +
                     ", past train.steps = " + std::to_string(cfg.train.steps));
  return at;
}

// Test hooks: a real signal (SIGUSR1, SIGKILL, SIGSTOP) raised by one rank
// at a given step, and the gradient faults of train/trainer.hpp.
struct TestHooks {
  int rank = env_int("TRIDENT_TEST_RANK", 0);
  int signal_at = env_int("TRIDENT_TEST_SIGNAL_AT_STEP", -1);
  int kill_at = env_int("TRIDENT_TEST_KILL_AT_STEP", -1);
  int stop_at = env_int("TRIDENT_TEST_STOP_AT_STEP", -1);
  GradientFault fault{env_int("TRIDENT_TEST_NAN_GRAD_AT_STEP", -1),
                      env_int("TRIDENT_TEST_FLIP_GRAD_AT_STEP", -1)};
};

model::CaptureRequest capture_request(const Config& cfg) {
  model::CaptureRequest capture;
  const OutputConfig& o = cfg.output;
  capture.layers.insert(o.activation_layers.begin(), o.activation_layers.end());
  capture.samples.insert(o.activation_samples.begin(), o.activation_samples.end());
  capture.names.insert(o.activations.begin(), o.activations.end());
  return capture;
}

void print_step(const StepResult& r) {
  const StepMetrics& m = r.metrics;
  std::printf(
      "step %5lld | loss %.4f | aux %.4f | lr %.2e | %8.0f tok/s | %.3f s | bubble %4.1f%% "
      "| comm MB cp %.2f pp %.2f ep %.2f dp %.2f\n",
      static_cast<long long>(m.step), m.loss, m.aux_loss, m.lr, m.tokens_per_s, m.step_time_s,
      100.0 * m.bubble_fraction, r.comm_bytes[0] / 1e6, r.comm_bytes[1] / 1e6,
      r.comm_bytes[2] / 1e6, r.comm_bytes[3] / 1e6);
  std::fflush(stdout);
}

void print_eval(const EvalMetrics& e) {
  std::printf("eval  %5lld | loss %.4f | perplexity %.3f | %lld targets\n",
              static_cast<long long>(e.step), e.loss, e.perplexity,
              static_cast<long long>(e.targets));
  std::fflush(stdout);
}

// The validation loss after `done` steps into /metrics/eval and the log.
void evaluate_into(Trainer& trainer, const model::DataSource& data, RunFile& file, int64_t done) {
  const Trainer::EvalResult r = trainer.evaluate(data, trainer.config().eval.steps);
  const EvalMetrics e{done, r.loss, std::exp(r.loss), r.targets};
  file.append_eval(e);
  if (trainer.comms().world->rank() == 0) print_eval(e);
}

// /data: the document-length histogram of the training data and, when
// packed, of the pieces the first steps' sequences hold (what attention sees).
void record_documents(Trainer& trainer, RunFile& file, int64_t start) {
  const Config& cfg = trainer.config();
  if (cfg.data.task != DataTask::tokens) return;
  const bool lead = trainer.comms().world->rank() == 0;
  std::vector<int64_t> docs, pieces;
  if (lead) docs = trainer.data().document_lengths_log2();
  file.write_length_histogram("document_lengths", docs,
                              "documents of the training data (whole, before packing)");
  if (cfg.data.packing != Packing::documents) return;
  const int64_t end = std::min<int64_t>(cfg.train.steps, start + kPieceSteps);
  for (int64_t step = start; lead && step < end; ++step)
    for (int64_t g = 0; g < trainer.samples_per_step(); ++g) {
      const std::vector<int32_t> ids = trainer.data().sample(step, g).doc_ids;
      for (size_t b = 0, e = 0; b < ids.size(); b = e) {
        while (e < ids.size() && ids[e] == ids[b]) ++e;
        model::add_log2_length(pieces, int64_t(e - b));
      }
    }
  file.write_length_histogram("packed_lengths", pieces,
                              "document pieces in the packed sequences of steps [" +
                                  std::to_string(start) + ", " + std::to_string(end) + ")");
}

// What the steps leave for the summary.
struct LoopTotals {
  double first_loss = NAN, last_loss = NAN, total_time = 0, compute_s = 0;
  int64_t steps_run = 0, last_ckpt_step = -1;
  std::string last_ckpt;
  int stopped_by = 0;  // the signal every rank agreed to stop on (0: none)
  int exit_code = 0;   // 1: a guard ended the job
  int64_t skipped = 0, skipped_in_row = 0, verified = 0;
  double verify_s = 0;
};

// The last good checkpoint, for the guards' messages.
std::string last_good(const LoopTotals& tot, const std::string& resumed_from) {
  if (!tot.last_ckpt.empty()) return tot.last_ckpt + " (kept)";
  if (!resumed_from.empty()) return resumed_from + " (resumed from, kept)";
  return "none written yet";
}

// One line on stderr from one rank.
void say(bool me, const char* level, const std::string& msg) {
  if (!me) return;
  std::fprintf(stderr, "trident: %s: %s\n", level, msg.c_str());
  std::fflush(stderr);
}

// train.on_nonfinite: records the step, warns (skip) or ends the job (stop,
// or train.max_skipped_steps in a row). Returns true when the job ends.
bool nonfinite_step(const StepResult& r, const Config& cfg, Communicator* world, RunFile& file,
                    LoopTotals& tot, const std::string& resumed_from) {
  const int64_t step = r.metrics.step;
  const int teller = r.nonfinite_rank >= 0 ? r.nonfinite_rank : 0;
  char where[96] = {};
  std::snprintf(where, sizeof where, "%s", r.nonfinite_param.c_str());
  world->broadcast(where, sizeof where, teller);
  const auto& t = cfg.train;
  const bool skip = t.on_nonfinite == NonFinitePolicy::skip;
  if (skip) ++tot.skipped;
  if (skip) ++tot.skipped_in_row;
  file.append_event(
      {step, "nonfinite", r.nonfinite_rank, r.metrics.loss, r.metrics.grad_norm, where});
  char what[320];
  if (r.nonfinite_rank >= 0)
    std::snprintf(what, sizeof what,
                  "step %lld: non-finite gradient, first in parameter %s on rank %d (loss %g, grad "
                  "norm %g)",
                  static_cast<long long>(step), where, r.nonfinite_rank, r.metrics.loss,
                  r.metrics.grad_norm);
  else
    std::snprintf(what, sizeof what,
                  "step %lld: non-finite loss (loss %g, aux %g, grad norm %g); every gradient "
                  "was finite before the reduction",
                  static_cast<long long>(step), r.metrics.loss, r.metrics.aux_loss,
                  r.metrics.grad_norm);
  const bool me = world->rank() == teller;
  if (skip && tot.skipped_in_row < t.max_skipped_steps) {
    say(me, "warning",
        std::string(what) + "; update skipped (" + std::to_string(tot.skipped_in_row) +
            " in a row, train.max_skipped_steps = " + std::to_string(t.max_skipped_steps) + ")");
    return false;
  }
  const std::string why = skip ? std::to_string(tot.skipped_in_row) +
                                     " steps in a row skipped (train.max_skipped_steps)"
                               : "train.on_nonfinite = \"stop\"";
  file.append_event({step, "stop", r.nonfinite_rank, double(tot.skipped_in_row), 0, why});
  say(me, "error",
      std::string(what) + "; stopped (" + why +
          "); last good checkpoint: " + last_good(tot, resumed_from));
  tot.exit_code = 1;
  return true;
}

// runtime.verify_every: a mismatch ends the job. Returns true when it does.
bool verify_failed(const StepResult& r, Communicator* world, RunFile& file, LoopTotals& tot) {
  if (!r.verified) return false;
  ++tot.verified;
  tot.verify_s += r.verify_s;
  if (r.verify_mismatch.empty()) return false;
  std::string ranks;
  for (int x : r.verify_mismatch) ranks += (ranks.empty() ? "" : ", ") + std::to_string(x);
  file.append_event({r.metrics.step, "verify_mismatch", r.verify_mismatch.front(),
                     double(r.verify_mismatch.size()), 0, "ranks " + ranks});
  say(world->rank() == r.verify_mismatch.front(), "error",
      "step " + std::to_string(r.metrics.step) +
          ": runtime.verify_every: the step re-executed from the same state gave other "
          "gradients or losses (bitwise) on rank(s) " +
          ranks + "; trident is deterministic, so suspect the hardware or memory of those ranks");
  tot.exit_code = 1;
  return true;
}

// train.loss_spike_factor: a stderr line and an event; every rank agrees.
void check_spike(const StepResult& r, Communicator* world, RunFile& file,
                 LossSpikeDetector& spikes) {
  double median = spikes.add(r.metrics.loss);
  world->broadcast(&median, sizeof median, 0);
  if (median <= 0) return;
  file.append_event({r.metrics.step, "loss_spike", -1, r.metrics.loss, median, ""});
  char msg[200];
  std::snprintf(msg, sizeof msg,
                "step %lld: loss %.4f is more than train.loss_spike_factor times the running "
                "median %.4f",
                static_cast<long long>(r.metrics.step), r.metrics.loss, median);
  say(world->rank() == 0, "warning", msg);
}

// The guards after a step's row is written. Returns true when the job ends.
bool guards_stop(const StepResult& r, const Config& cfg, Communicator* world, RunFile& file,
                 LoopTotals& tot, LossSpikeDetector& spikes, const std::string& resumed_from) {
  if (verify_failed(r, world, file, tot)) return true;
  if (!r.finite) return nonfinite_step(r, cfg, world, file, tot, resumed_from);
  tot.skipped_in_row = 0;
  if (cfg.train.loss_spike_factor > 0) check_spike(r, world, file, spikes);
  return false;
}

// A step restarted inside the allocation (slurm/trident.sbatch, on a spare):
// after its first step, a `restart` event with the node left out, the
// checkpoint resumed from, the steps lost and the seconds from the failure
// to the end of that first step (rank 0's clock, as the template's).
void record_restart(RunFile& file, Communicator& world, int64_t step, const ResumePoint& at) {
  const int64_t resumed_at = at.step;
  const char* node = std::getenv("TRIDENT_RESTART_NODE");
  const char* failed_at = std::getenv("TRIDENT_RESTART_FAILED_AT");
  if (env_int("TRIDENT_RESTART_ATTEMPT", 0) <= 0 || !node || !failed_at) return;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  double since = now - std::atof(failed_at);
  world.broadcast(&since, sizeof since, 0);
  const int64_t last = env_int("TRIDENT_RESTART_LAST_STEP", -1);  // the last step logged
  const double lost = last >= 0 ? double(std::max<int64_t>(0, last + 1 - resumed_at)) : -1.0;
  const std::string from = at.checkpoint.empty() ? "no checkpoint (from the start)"
                           : at.tier == "local"
                               ? "the local tier: " + at.checkpoint
                               : "the shared checkpoint directory: " + at.checkpoint;
  file.append_event({step, "restart", -1, since, lost,
                     "node " + std::string(node) + " left out; resumed from " + from});
}

// The step boundary's agreement: a stop signal on any rank, and whether
// every rank's background checkpoint write has finished (then it commits)
// or one failed (then the job ends with its line). Returns the signal.
// Rank 0's straggler verdict travels in the same reduction (RankStats).
int agree_at_boundary(Communicator* world, CheckpointSaver& saver, LoopTotals& tot,
                      RankStats& stats, RunFile& file, CheckpointSaver* local) {
  if (local) local->progress();
  int flags[6] = {stop_signal_received(),       saver.writing(),
                  saver.failed_code(),          stats.verdict(),
                  local ? local->writing() : 0, local ? local->failed_code() : 0};
  world->allreduce_max(flags, 6);
  stats.record(flags[3], file);
  saver.settle(flags[1], flags[2]);
  if (local) local->settle(flags[4], flags[5]);
  tot.last_ckpt = saver.last_path();
  tot.last_ckpt_step = saver.last_step();
  return flags[0];
}

// The saves after `done` steps: the checkpoint directory's every
// output.checkpoint_every steps, on a stop and at the end; else the local
// tier's every output.local_checkpoint_every steps.
void save_at_boundary(const Config& cfg, CheckpointSaver& saver, CheckpointSaver* local,
                      RankStats& stats, LoopTotals& tot, int64_t done, int stop) {
  const int every = cfg.output.checkpoint_every, local_every = cfg.output.local_checkpoint_every;
  const double t_save = now_s();
  if ((every > 0 && done % every == 0) || stop || done == cfg.train.steps) {
    saver.save(done);
    tot.last_ckpt = saver.last_path();
    tot.last_ckpt_step = saver.last_step();
  } else if (local && local_every > 0 && done % local_every == 0) {
    local->save(done);
  } else {
    return;
  }
  stats.add_checkpoint_s(now_s() - t_save);
}

// The test hooks that act before a step: SIGKILL or SIGSTOP on one rank.
void raise_test_hooks(const TestHooks& hooks, int rank, int64_t step) {
  if (rank == hooks.rank && step == hooks.kill_at) std::raise(SIGKILL);
  if (rank == hooks.rank && step == hooks.stop_at) std::raise(SIGSTOP);
}

// A step's row (events, rank stats, captured activations) into the run file.
void record_step(Trainer& trainer, RunFile& file, RankStats& stats, int64_t step, bool cap,
                 const StepResult& r) {
  const Config& cfg = trainer.config();
  file.append_step(r.metrics, r.comm_bytes, r.expert_tokens);
  if (cfg.output.timeline) file.append_events(r.events);
  stats.after_step(step, r.times, file);
  if (cap)
    write_activations(file, cfg, trainer.comms().world, step, trainer.positions(), r.captures);
  file.flush();
}

// The loop's running figures after a step.
void add_to_totals(const StepResult& r, LoopTotals& tot) {
  if (std::isnan(tot.first_loss)) tot.first_loss = r.metrics.loss;
  tot.last_loss = r.metrics.loss;
  tot.total_time += r.metrics.step_time_s;
  tot.compute_s += r.compute_s;
  ++tot.steps_run;
}

// Steps [start, train.steps), until then, a stop signal or a guard's stop.
LoopTotals run_steps(Trainer& trainer, RunFile& file, CheckpointSaver& saver, RankStats& stats,
                     const ResumePoint& at, const model::DataSource* eval_data,
                     CheckpointSaver* local) {
  const int64_t start = at.step;
  const std::string& resumed_from = at.checkpoint;
  const Config& cfg = trainer.config();
  Communicator* world = trainer.comms().world;
  const int rank = world->rank();
  const TestHooks hooks;
  const std::set<int> capture_steps(cfg.output.activation_steps.begin(),
                                    cfg.output.activation_steps.end());
  model::CaptureRequest capture = capture_request(cfg);
  LossSpikeDetector spikes(cfg.train.loss_spike_factor);
  if (rank == hooks.rank) trainer.set_gradient_fault(hooks.fault);
  LoopTotals tot;
  for (int64_t step = start; step < cfg.train.steps; ++step) {
    raise_test_hooks(hooks, rank, step);
    flight_poll();  // SIGUSR2: the flight records, and the run goes on
    const bool cap = capture_steps.count(int(step)) && capture.active();
    StepResult r = trainer.train_step(step, cap ? &capture : nullptr);
    record_step(trainer, file, stats, step, cap, r);
    add_to_totals(r, tot);
    if (rank == 0) print_step(r);
    if (step == start) record_restart(file, *world, step, at);
    if (guards_stop(r, cfg, world, file, tot, spikes, resumed_from)) break;
    if (eval_data && (step + 1) % cfg.eval.every == 0)
      evaluate_into(trainer, *eval_data, file, step + 1);
    if (rank == hooks.rank && step == hooks.signal_at) std::raise(SIGUSR1);
    // every rank sees the same decision at the same step boundary
    const int stop = agree_at_boundary(world, saver, tot, stats, file, local);
    save_at_boundary(cfg, saver, local, stats, tot, step + 1, stop);
    if (stop) {
      tot.stopped_by = stop;
      break;
    }
  }
  return tot;
}

// Per-rank summaries into the run file, and the closing lines on rank 0.
void summarise(Trainer& trainer, RunFile& file, const LoopTotals& tot, const CommCounters& at_start,
               const std::string& path) {
  Communicator* world = trainer.comms().world;
  RankSummary rs;
  rs.rank = world->rank();
  rs.peak_rss_bytes = peak_rss_bytes();
  rs.peak_alloc_bytes = double(cpu_allocator().peak_bytes());
  if (!trainer.device().is_cpu()) rs.peak_device_bytes = double(trainer.allocator().peak_bytes());
  const auto& by_kind = trainer.allocator().peak_bytes_by_kind();
  for (int k = 0; k < kNumMemKinds; ++k) rs.peak_kind_bytes[k] = double(by_kind[size_t(k)]);
  rs.compute_s = tot.compute_s;
  const CommCounters comm_total = trainer.counters() - at_start;
  for (int k = 0; k < 4; ++k) rs.comm_wait_s[k] = comm_total.wait_s[size_t(k)];
  file.write_rank_summaries(rs);
  // the longest wait since the process started: what runtime.timeout_s must exceed
  double maxes[2] = {rs.peak_rss_bytes, trainer.counters().longest_wait_s};
  world->allreduce_max(maxes, 2);
  const double peak = maxes[0];
  // cp and ep waits happen inside F/B (ring, all-to-all); pp and dp waits outside them
  double sums[3] = {tot.compute_s, rs.comm_wait_s[0] + rs.comm_wait_s[2],
                    rs.comm_wait_s[1] + rs.comm_wait_s[3]};
  world->allreduce_sum(sums, 3);
  file.set_root_attr("stopped_by_signal", tot.stopped_by ? std::to_string(tot.stopped_by) : "");
  file.set_root_attr("skipped_steps", tot.skipped);
  file.set_root_attr("verified_steps", tot.verified);
  file.set_root_attr("verify_overhead_s", tot.verify_s);
  file.set_root_attr("longest_wait_s", maxes[1]);
  file.close();
  if (world->rank() != 0) return;
  const double denom = tot.total_time * world->size();
  auto pct = [&](double x) { return denom > 0 ? 100.0 * x / denom : 0.0; };
  const double tokens = double(trainer.tokens_per_step()) * double(tot.steps_run);
  std::printf(
      "done: %lld steps, loss %.4f -> %.4f, %.0f tokens/s; of rank time: F/B/W %.0f%% "
      "(of which cp+ep wait %.0f%%), pp+dp wait %.0f%%; peak RSS %.0f MB/rank; run file %s\n",
      static_cast<long long>(tot.steps_run), tot.first_loss, tot.last_loss,
      tot.total_time > 0 ? tokens / tot.total_time : 0.0, pct(sums[0]), pct(sums[1]), pct(sums[2]),
      peak / 1e6, path.c_str());
  if (!tot.last_ckpt.empty()) std::printf("checkpoint: %s\n", tot.last_ckpt.c_str());
  std::printf("waits: longest %.3f s (runtime.timeout_s = %g s)\n", maxes[1],
              trainer.config().runtime.timeout_s);
  if (tot.skipped > 0)
    std::printf("skipped: %lld step(s) with a non-finite loss or gradient (no update)\n",
                static_cast<long long>(tot.skipped));
  if (tot.verified > 0)
    std::printf("verify: %lld step(s) re-executed, %s; overhead %.3f s (%.1f%% of step time)\n",
                static_cast<long long>(tot.verified),
                tot.exit_code ? "a mismatch ended the run" : "every one bitwise equal",
                tot.verify_s, tot.total_time > 0 ? 100.0 * tot.verify_s / tot.total_time : 0.0);
  if (tot.stopped_by)
    std::printf("stopped by signal %d at step %lld: checkpoint written, resume with --resume\n",
                tot.stopped_by, static_cast<long long>(tot.last_ckpt_step));
  std::fflush(stdout);
}

}  // namespace

void stage_device_buffers(Communicators& c, const kernels::Ctx& ctx, double timeout_s) {
  const std::shared_ptr<DeviceStaging> staging = kernels::device_staging(ctx, timeout_s);
  if (!staging) return;
  for (auto* g : {&c.world, &c.cp, &c.pp, &c.dp, &c.dpcp, &c.ep, &c.expert_replica})
    if (*g) (*g)->stage_device_buffers(staging);
}

std::unique_ptr<Trainer> make_trainer(const Config& cfg, Communicators& comms) {
  auto trainer = std::make_unique<Trainer>(cfg, train_comms(comms));
  stage_device_buffers(comms, trainer->ctx(), cfg.runtime.timeout_s);
  // A device backend's communication runs after the compute queued before it
  // (comm.hpp), so it needs the stream the step computes on.
  for (auto* g : {&comms.world, &comms.cp, &comms.pp, &comms.dp, &comms.dpcp, &comms.ep,
                  &comms.expert_replica})
    if (*g) (*g)->set_compute_stream(trainer->ctx().stream);
  return trainer;
}

int64_t load_checkpoint_everywhere(Trainer& trainer, const std::string& checkpoint) {
  int64_t step = 0;
  const std::string why = load_everywhere(trainer, checkpoint, step);
  if (!why.empty()) throw InputError("--checkpoint: " + why);
  return step;
}

EvalReport evaluate_checkpoint(const Config& cfg, Communicators& comms,
                               const std::string& checkpoint) {
  auto trainer = make_trainer(cfg, comms);
  const auto data = model::make_data_source(cfg, comms.mesh.dp, model::DataPart::validation);
  EvalReport rep;
  rep.step = load_checkpoint_everywhere(*trainer, checkpoint);
  const Trainer::EvalResult r = trainer->evaluate(*data, cfg.eval.steps);
  rep.loss = r.loss;
  rep.perplexity = std::exp(r.loss);
  rep.targets = r.targets;
  rep.sequences = trainer->samples_per_step() * cfg.eval.steps;
  return rep;
}

// The node-local tier's directories, before the run file exists (a
// directory that cannot be made is the input's fault: exit 2). A run that
// does not resume from the tier empties its nodes' directories first (steps
// there are not on this run's way); one that does keeps only the step it
// resumed from.
void prepare_local_tier(Trainer& trainer, const std::vector<std::string>& hosts,
                        const ResumePoint& at) {
  const OutputConfig& o = trainer.config().output;
  if (o.local_checkpoint_dir.empty()) return;
  Communicator& world = *trainer.comms().world;
  const int me = world.rank();
  const bool node_lead =
      std::find(hosts.begin(), hosts.end(), hosts[size_t(me)]) - hosts.begin() == me;
  const std::string dir = local_node_dir(o, hosts[size_t(me)]);
  std::error_code ec;
  if (node_lead && at.tier != "local") std::filesystem::remove_all(dir, ec);
  if (node_lead && at.tier == "local") remove_local_steps_except(dir, at.step);
  if (node_lead) std::filesystem::create_directories(dir, ec);
  const CheckOutcome made = agree_on_check(
      world, !ec, "output.local_checkpoint_dir: cannot create " + dir + ": " + ec.message());
  if (!made.all_passed) throw InputError(made.message);
}

// The node-local tier's saver (output.local_checkpoint_dir; null when off).
std::unique_ptr<CheckpointSaver> make_local_saver(Trainer& trainer, RunFile& file,
                                                  const std::vector<std::string>& hosts) {
  const OutputConfig& o = trainer.config().output;
  if (o.local_checkpoint_dir.empty()) return nullptr;
  const std::vector<int> partners = partner_ranks(hosts);
  if (trainer.comms().world->rank() == 0)
    std::printf("local checkpoints every %d steps in %s/<node>%s\n", o.local_checkpoint_every,
                local_job_dir(o).c_str(),
                partners[0] < 0 ? "; one node: no partner copies, a lost node loses them"
                                : ", each rank's shard copied to a partner on the next node");
  return std::make_unique<CheckpointSaver>(trainer, &file, &hosts);
}

int run(const Config& cfg, Communicators& comms, const RunRequest& request) {
  auto trainer_ptr = make_trainer(cfg, comms);
  Trainer& trainer = *trainer_ptr;
  validate_activation_request(cfg, trainer.samples_per_step());
  double load_s = now_s();
  std::vector<std::string> hosts;  // each rank's node label
  for (const RankInfo& r : comms.topo.ranks) hosts.push_back(r.hostname);
  const ResumePoint at = resume_point(cfg, request, trainer, hosts);
  prepare_local_tier(trainer, hosts, at);
  load_s = now_s() - load_s;
  comms.world->allreduce_max(&load_s, 1);  // the slowest rank's
  std::unique_ptr<model::DataSource> eval_data;
  if (cfg.eval.every > 0)
    eval_data = model::make_data_source(cfg, comms.mesh.dp, model::DataPart::validation);

  // Every input is valid: now the run file may exist.
  const std::string path = resolve_output_name(cfg.output.file, *comms.world);
  const char* job = std::getenv("SLURM_JOB_ID");
  flight_set_output(flight_dir_of(path), comms.world->rank(), hosts);
  RunFile file(path, *comms.world, cfg, comms, job ? job : "");
  file.set_root_attr("command_line", request.command_line);
  file.set_root_attr("backend", backend_name(trainer.device()));
  if (!at.checkpoint.empty()) file.set_root_attr("resumed_from", at.checkpoint);
  if (!at.checkpoint.empty()) file.set_root_attr("resume_load_s", load_s);
  if (!request.prediction_json.empty()) file.set_root_attr("prediction", request.prediction_json);
  install_stop_signals();
  const bool lead = comms.world->rank() == 0;
  if (lead) {
    std::printf(
        "trident run: %s on %d ranks (pp=%d dp=%d cp=%d ep=%d, %s), %lld tokens/step -> %s\n",
        request.config_path.c_str(), comms.world->size(), comms.mesh.pp, comms.mesh.dp,
        comms.mesh.cp, comms.mesh.ep, config_name(cfg.parallel.schedule).c_str(),
        static_cast<long long>(trainer.tokens_per_step()), path.c_str());
    if (!at.checkpoint.empty())
      std::printf("resumed from %s at step %lld\n", at.checkpoint.c_str(),
                  static_cast<long long>(at.step));
    std::fflush(stdout);
  }
  const CommCounters at_start = trainer.counters();
  record_documents(trainer, file, at.step);
  CheckpointSaver saver(trainer, &file);
  std::unique_ptr<CheckpointSaver> local = make_local_saver(trainer, file, hosts);
  RankStats stats(cfg, *comms.world, comms.me.pp, hosts);
  LoopTotals tot = run_steps(trainer, file, saver, stats, at, eval_data.get(), local.get());
  stats.finish(file);
  saver.finish();  // a background save: durable and committed before the summary says so
  if (local) local->finish();
  if (local && tot.exit_code == 0) clean_local_tier(*comms.world, cfg.output, hosts);
  tot.last_ckpt = saver.last_path();
  tot.last_ckpt_step = saver.last_step();
  if (tot.last_ckpt_step < 0 && at.step == cfg.train.steps && lead)
    std::printf("nothing to do: the checkpoint is at train.steps = %d\n", cfg.train.steps);
  summarise(trainer, file, tot, at_start, path);
  return tot.exit_code;
}

}  // namespace trident::train
