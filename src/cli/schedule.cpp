// `trident schedule`: generate (or import) a pipeline schedule, print its
// per-rank action lists, export it as CSV, and simulate it: deadlock check,
// makespan, bubble and activation memory per rank, and the ASCII timeline.
#include "trident/parallel/pp/schedule.hpp"

#include <cstdio>
#include <iostream>
#include <sstream>

#include "commands.hpp"
#include "trident/core/error.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/parallel/pp/simulator.hpp"
#include "trident/parallel/pp/torch_csv.hpp"

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
    app->add_option("--export", export_,
                    "write the schedule as CSV (trident: lowered, with a header; torch: "
                    "compute-only, what PyTorch's _load_csv reads)");
    app->add_option("--import", import_,
                    "read a schedule from CSV (one row per rank; compute-only rows are lowered)");
    app->add_option("--format", format_,
                    "CSV format of --import and --export: trident | torch | auto (import: "
                    "trident when the file has a '#' line, which PyTorch never writes; export: "
                    "trident)")
        ->capture_default_str();
    app->add_option("--tf", costs_.t_f, "forward cost (time units)")->capture_default_str();
    app->add_option("--tb", costs_.t_b, "input-gradient cost (time units)")->capture_default_str();
    app->add_option("--tw", costs_.t_w, "weight-gradient cost (non-split B costs tb+tw)")
        ->capture_default_str();
    app->add_option("--latency", costs_.latency, "send-to-receive latency (time units)")
        ->capture_default_str();
    app->add_option("--ef", costs_.e_f,
                    "EP exchange time inside --tf: an overlapped F+B slot (dualpipev) hides it "
                    "behind the B's compute")
        ->capture_default_str();
    app->add_option("--eb", costs_.e_b,
                    "EP exchange time inside --tb: hidden behind the overlapped F's compute")
        ->capture_default_str();
    app->add_flag("--no-overlap", no_overlap_,
                  "price overlapped F+B slots as F then B (runtime.ep_overlap = false)");
    app->add_option("--layout", layout_,
                    "layers per virtual stage, comma-separated (parallel.pp_layout): each "
                    "stage's actions cost its layers over the mean")
        ->delimiter(',');
  }
  bool needs_mpi() const override { return false; }

  int run() override {
    check_flags();
    costs_.overlap_pairs = !no_overlap_;
    pp::Schedule s = import_.empty() ? named_schedule() : imported_schedule();
    if (!layout_.empty()) apply_layout(s);
    // Simulate before exporting so that a broken schedule leaves no file.
    pp::SimResult sim;
    if (simulate_ || !import_.empty()) sim = pp::simulate(s, costs_, stage_work_);
    std::cout << pp::format_actions(s);
    if (simulate_) print_simulation(s, sim);
    if (!export_.empty()) {
      pp::write_schedule_file(export_, format_ == "torch" ? pp::to_torch_csv(s) : pp::to_csv(s));
      std::printf("wrote %s\n", export_.c_str());
    }
    return 0;
  }

 private:
  void check_flags() const {
    if (format_ != "auto" && format_ != "trident" && format_ != "torch")
      throw InputError("--format " + format_ + ": must be trident, torch or auto");
    for (auto [v, flag] : {std::pair{costs_.t_f, "--tf"}, std::pair{costs_.t_b, "--tb"},
                           std::pair{costs_.t_w, "--tw"}, std::pair{costs_.latency, "--latency"},
                           std::pair{costs_.e_f, "--ef"}, std::pair{costs_.e_b, "--eb"}})
      if (!(v >= 0)) throw InputError(std::string(flag) + ": must be >= 0");
    if (costs_.e_f > costs_.t_f || costs_.e_b > costs_.t_b)
      throw InputError("--ef and --eb: the exchange is part of --tf and --tb, so at most them");
  }

  // --import FILE: lowered (sends and receives added) when it has compute only.
  pp::Schedule imported_schedule() const {
    if (!name_.empty()) throw InputError("schedule: give either NAME or --import FILE, not both");
    if (pp_opt_->count() || m_opt_->count())
      throw InputError("--import: --pp and --microbatches come from the file; do not pass them");
    pp::Schedule s = import_schedule();
    if (!s.has_comm()) {
      pp::validate(s);  // compute order first, so the message names the missing compute
      s = pp::lower(s);
    }
    pp::validate(s);
    return s;
  }

  pp::Schedule named_schedule() const {
    if (name_.empty())
      throw InputError(
          "schedule: NAME (afab, 1f1b, interleaved, zb-h1, zb-v, dualpipev) or --import FILE is "
          "required");
    if (!pp_opt_->count()) throw InputError("--pp: required");
    if (!m_opt_->count()) throw InputError("--microbatches: required");
    const int vpp = vpp_opt_->count() ? vpp_ : pp::default_vpp(name_);
    pp::Schedule s = pp::lower(pp::make_schedule(name_, pp_, m_, vpp));
    pp::validate(s);
    return s;
  }

  // --layout: each virtual stage's layers.
  void apply_layout(const pp::Schedule& s) {
    if (int(layout_.size()) != s.num_stages())
      throw InputError("--layout: " + std::to_string(layout_.size()) +
                       " entries; the schedule has " + std::to_string(s.num_stages()) +
                       " virtual stages (pp * vpp)");
    for (int n : layout_)
      if (n < 1)
        throw InputError("--layout: every stage needs a layer (got " + std::to_string(n) + ")");
    stage_work_ = pp::stage_work_of_layout(layout_);
  }

  void print_simulation(const pp::Schedule& s, const pp::SimResult& sim) const {
    std::cout << "\n" << pp::format_report(s, sim, costs_);
    const pp::ClosedForm cf = pp::closed_form_bubble(s.name, s.pp, s.microbatches, s.vpp,
                                                     costs_.t_f, costs_.t_b, costs_.t_w);
    if (cf.exists() && costs_.latency == 0 && layout_.empty())
      std::printf("closed form %s = %.4f of ideal time, i.e. bubble fraction %.4f\n",
                  cf.formula.c_str(), cf.ratio, cf.fraction);
    std::cout << "\n" << pp::format_timeline(s, sim);
  }

  // --import in the chosen (or detected) format; notes go to stdout.
  pp::Schedule import_schedule() const {
    const std::string text = pp::read_schedule_file(import_);
    const bool torch = format_ == "torch" || (format_ == "auto" && !has_comment_line(text));
    if (!torch) return pp::from_csv(text, import_);
    pp::TorchImport in = pp::from_torch_csv(text, import_);
    if (format_ == "auto")
      in.notes.insert(in.notes.begin(), import_ +
                                            ": read as PyTorch's format (no '#' line; --format "
                                            "trident reads it as trident's)");
    for (const std::string& n : in.notes) std::printf("note: %s\n", n.c_str());
    return in.schedule;
  }

  static bool has_comment_line(const std::string& text) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      const auto first = line.find_first_not_of(" \t");
      if (first != std::string::npos && line[first] == '#') return true;
    }
    return false;
  }

  std::string name_, export_, import_, format_ = "auto";
  std::vector<int> layout_;
  std::vector<double> stage_work_;
  int pp_ = 0, m_ = 0, vpp_ = 1;
  bool simulate_ = false, no_overlap_ = false;
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
