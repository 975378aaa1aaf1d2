// `trident bench schedule`: the flags of the pipeline executor benchmark
// (src/bench/schedule.cpp measures; trident/bench/schedule.hpp says what).
#include "commands.hpp"
#include "trident/bench/schedule.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/config.hpp"
#include "trident/parallel/pp/executor.hpp"
#include "trident/train/check_config.hpp"

namespace trident::cli {
namespace {

class BenchScheduleCommand : public Command {
 public:
  explicit BenchScheduleCommand(CLI::App& parent) {
    auto* app = parent.add_subcommand(
        "schedule", "Pipeline executor: measured vs simulated bubble (mpirun -np PP)");
    app->add_option("config", config_path_,
                    "Config file (TOML): runtime.backend (the boundary buffers' device) and "
                    "runtime.comm (the messages' backend); none: on the host, over MPI");
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--schedule", o_.schedule,
                    "all | afab | 1f1b | interleaved | zb-h1 | zb-v | dualpipev")
        ->capture_default_str();
    app->add_option("--pp", o_.pp, "pipeline ranks (= mpirun -np)")->required();
    app->add_option("--microbatches", o_.m, "micro-batches per step")->required();
    vpp_opt_ = app->add_option(
                      "--vpp", o_.vpp,
                      "chunks per rank for the interleaved schedule (zb-v and dualpipev: always 2)")
                   ->capture_default_str();
    app->add_option("--tf", o_.tf_ms,
                    "forward time of a rank's share of the model per micro-batch (ms)")
        ->required();
    app->add_option("--tb", o_.tb_ms, "input-gradient time (ms)")->required();
    tw_opt_ = app->add_option("--tw", o_.tw_ms,
                              "weight-gradient time (ms; default: --tf). Non-split schedules run "
                              "B = tb + tw; schedules with v chunks per rank (interleaved, zb-v, "
                              "dualpipev) run each chunk at 1/v of these");
    app->add_option("--steps", o_.steps, "measured steps per schedule (after one warm-up step)")
        ->capture_default_str();
    app->add_option("--bytes", o_.bytes, "bytes of each activation / gradient message")
        ->capture_default_str();
    app->add_flag("--spin", o_.spin, "spin instead of sleeping (uses a core per rank)");
    timeout_opt_ = app->add_option("--timeout", o_.timeout_s,
                                   "deadline of any single wait (s; default: runtime.timeout_s)");
    app->add_option("--recv-poll", o_.recv_poll_ms,
                    "a receive polls with yields this long before the Communicator's sleeping "
                    "backoff takes over (ms; 0: backoff from the start)")
        ->capture_default_str();
    app->add_option("--output", o_.output, "write the tables and the timeline to this HDF5 file");
  }
  bool needs_mpi() const override { return true; }

  int run() override {
    if (!tw_opt_->count()) o_.tw_ms = o_.tf_ms;
    o_.vpp_given = vpp_opt_->count() > 0;
    o_.command_line = command_line();
    Config cfg = load_config(config_path_, sets_);
    if (timeout_opt_->count()) cfg.runtime.timeout_s = o_.timeout_s;
    o_.timeout_s = cfg.runtime.timeout_s;
    train::check_config(cfg, comm_world_size());
    return bench::run_schedule_bench(cfg, o_);
  }

 private:
  std::string config_path_;
  std::vector<std::string> sets_;
  CLI::Option* timeout_opt_ = nullptr;
  bench::ScheduleBenchOptions o_ = defaults();
  CLI::Option* tw_opt_ = nullptr;
  CLI::Option* vpp_opt_ = nullptr;

  static bench::ScheduleBenchOptions defaults() {
    bench::ScheduleBenchOptions o;
    o.recv_poll_ms = pp::ExecOptions{}.recv_poll_s * 1e3;
    return o;
  }
};

}  // namespace

std::unique_ptr<Command> add_bench_schedule(CLI::App& parent) {
  return std::make_unique<BenchScheduleCommand>(parent);
}

}  // namespace trident::cli
