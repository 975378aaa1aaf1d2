// `trident schedule`: generate (or import) a pipeline schedule, print its
// per-rank action lists, export it as CSV, and simulate it: deadlock check,
// makespan, bubble and activation memory per rank, and the ASCII timeline.
#include "trident/parallel/pp/schedule.hpp"

#include <cstdio>
#include <iostream>

#include "commands.hpp"
#include "trident/core/error.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/parallel/pp/simulator.hpp"

namespace trident::cli {
namespace {

class ScheduleCommand : public Command {
 public:
  explicit ScheduleCommand(CLI::App& parent) {
    auto* app = parent.add_subcommand("schedule",
                                      "Generate, export, import and simulate pipeline schedules");
    app->add_option("name", name_,
                    "afab | 1f1b | interleaved | zb-h1 | zb-v | dualpipev (omit with --import)");
    pp_opt_ = app->add_option("--pp", pp_, "pipeline ranks");
    m_opt_ = app->add_option("--microbatches", m_, "micro-batches per step");
    vpp_opt_ = app->add_option(
        "--vpp", vpp_, "model chunks per rank (interleaved; zb-v and dualpipev: 2, the default)");
    app->add_flag("--simulate", simulate_, "simulate: deadlock, makespan, bubble, timeline");
    app->add_option("--export", export_, "write the lowered schedule as CSV");
    app->add_option("--import", import_,
                    "read a schedule from CSV (one row per rank; compute-only rows are lowered)");
    app->add_option("--tf", costs_.t_f, "forward cost (time units)")->capture_default_str();
    app->add_option("--tb", costs_.t_b, "input-gradient cost (time units)")->capture_default_str();
    app->add_option("--tw", costs_.t_w, "weight-gradient cost (non-split B costs tb+tw)")
        ->capture_default_str();
    app->add_option("--latency", costs_.latency, "send-to-receive latency (time units)")
        ->capture_default_str();
  }
  bool needs_mpi() const override { return false; }

  int run() override {
    using namespace trident::pp;
    for (auto [v, flag] : {std::pair{costs_.t_f, "--tf"}, std::pair{costs_.t_b, "--tb"},
                           std::pair{costs_.t_w, "--tw"}, std::pair{costs_.latency, "--latency"}})
      if (!(v >= 0)) throw InputError(std::string(flag) + ": must be >= 0");
    Schedule s;
    if (!import_.empty()) {
      if (!name_.empty()) throw InputError("schedule: give either NAME or --import FILE, not both");
      if (pp_opt_->count() || m_opt_->count())
        throw InputError("--import: --pp and --microbatches come from the file; do not pass them");
      s = read_csv_file(import_);
      if (!s.has_comm()) {
        validate(s);  // compute order first, so the message names the missing compute
        s = lower(s);
      }
      validate(s);
    } else {
      if (name_.empty())
        throw InputError(
            "schedule: NAME (afab, 1f1b, interleaved, zb-h1, zb-v, dualpipev) or --import FILE is "
            "required");
      if (!pp_opt_->count()) throw InputError("--pp: required");
      if (!m_opt_->count()) throw InputError("--microbatches: required");
      const int vpp = vpp_opt_->count() ? vpp_ : default_vpp(name_);
      s = lower(make_schedule(name_, pp_, m_, vpp));
      validate(s);
    }
    // Simulate before exporting so that a broken schedule leaves no file.
    SimResult sim;
    if (simulate_ || !import_.empty()) sim = simulate(s, costs_);
    std::cout << format_actions(s);
    if (simulate_) {
      std::cout << "\n" << format_report(s, sim, costs_);
      const ClosedForm cf = closed_form_bubble(s.name, s.pp, s.microbatches, s.vpp, costs_.t_f,
                                               costs_.t_b, costs_.t_w);
      if (cf.exists() && costs_.latency == 0) {
        std::printf("closed form %s = %.4f of ideal time, i.e. bubble fraction %.4f\n",
                    cf.formula.c_str(), cf.ratio, cf.fraction);
      }
      std::cout << "\n" << format_timeline(s, sim);
    }
    if (!export_.empty()) {
      write_csv_file(s, export_);
      std::printf("wrote %s\n", export_.c_str());
    }
    return 0;
  }

 private:
  std::string name_, export_, import_;
  int pp_ = 0, m_ = 0, vpp_ = 1;
  bool simulate_ = false;
  pp::SimCosts costs_;
  CLI::Option* pp_opt_ = nullptr;
  CLI::Option* m_opt_ = nullptr;
  CLI::Option* vpp_opt_ = nullptr;
};

}  // namespace

std::unique_ptr<Command> add_schedule_command(CLI::App& parent) {
  return std::make_unique<ScheduleCommand>(parent);
}

}  // namespace trident::cli
