// trident: entry point. Parses the command line, starts the communication
// runtime (MPI) for the commands that need it, runs the command, and turns
// errors into one line and an exit code: 0 success, 2 invalid input, 1
// anything else.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "trident/comm/flight_recorder.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/clock.hpp"
#include "trident/core/error.hpp"

namespace trident::cli {

static std::string g_command_line;
const std::string& command_line() { return g_command_line; }

int launcher_rank() { return comm_launcher_rank(); }

namespace {

// Another rank reports the failure within half a second of its own (it
// first listens for a lower rank that failed alike); this one leaves a
// second later, since leaving first could let the launcher end the reporter
// before it prints.
[[noreturn]] void leave_after_reporter(int code) {
  std::this_thread::sleep_for(std::chrono::seconds(1));
  comm_exit_now(code);
}

void print_error(const std::string& msg) {
  std::fprintf(stderr, "trident: error: %s\n", msg.c_str());
  std::fflush(stderr);
}

// " rank 3 did not answer ..." for the line of a rank whose wait failed:
// the peer it waited on may itself be waiting, so the ranks that are gone
// are named by asking every rank (comm_silent_ranks).
std::string silent_note(const std::vector<int>& silent, double seconds, bool timed_out) {
  if (silent.empty())
    return timed_out ? "; every rank answered a probe (none is stopped or dead)" : "";
  std::string who = silent.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < silent.size() && i < 8; ++i)
    who += (i ? ", " : "") + std::to_string(silent[i]);
  if (silent.size() > 8) who += " and " + std::to_string(silent.size() - 8) + " more";
  char s[32];
  std::snprintf(s, sizeof s, "%g s", seconds);
  return "; " + who + " did not answer within " + s + " (stopped or dead, or busy outside a wait)";
}

// The ending every rank of a job takes. All ranks reached the error (the
// usual case: every rank validates the same input, or agreed on the
// failure)? Then the one that knows prints, and all finalise cleanly so the
// exit code is ours. Otherwise this rank failed alone: it asks which ranks
// are gone, tells the others (they end quietly, see comm/process.hpp), and
// prints unless another rank failed earlier (its failure is the cause, this
// one a consequence: then this rank leaves quietly with that rank's exit
// code), and ends without waiting for anyone.
int finish_with_error(bool mpi_on, int code, const std::string& msg, bool symmetric, bool reporter,
                      bool timed_out = false) {
  const double t_fail = now_s();
  const int rank = mpi_on ? comm_world_rank() : launcher_rank();
  // the flight records first: before anything that may wait, or the launcher's kill
  if (mpi_on) flight_dump(msg, comm_stopped_s());
  if (!mpi_on) {
    if (rank == 0) print_error(msg);
    return code;
  }
  if (symmetric && comm_all_arrive_within(10.0)) {
    if (reporter) print_error(msg);
    comm_finalize();
    return code;
  }
  int first_code = 0;
  if (comm_earlier_failure_within(t_fail, 0.0, &first_code)) leave_after_reporter(first_code);
  if (timed_out && comm_was_stopped()) leave_after_reporter(code);
  constexpr double kProbeS = 2.0;  // a waiting rank answers within milliseconds
  const std::vector<int> silent = comm_silent_ranks(kProbeS);
  if (comm_earlier_failure_within(t_fail, 0.0, &first_code)) leave_after_reporter(first_code);
  comm_notify_failure(code, t_fail);
  if (comm_earlier_failure_within(t_fail, 0.5, &first_code)) leave_after_reporter(first_code);
  const std::string prefix = "rank " + std::to_string(rank) + ":";
  print_error((msg.rfind(prefix, 0) == 0 ? msg : prefix + " " + msg) +
              silent_note(silent, kProbeS, timed_out));
  comm_exit_now(code);
}

// A call that waits for every rank inside a library (parallel HDF5) passed
// its deadline: the watchdog thread ends this rank as a timed-out wait would.
void blocking_call_expired(const std::string& message) {
  finish_with_error(true, 1, message, false, true, true);
  comm_exit_now(1);  // not reached: the error path of a rank failing alone ends the process
}

// Every command under the path of the subcommand it registered ("run",
// "bench moe", "convert hf"): chosen_command finds the parsed subcommand's
// Command by that name, whatever order the commands are added in.
using Commands = std::map<std::string, std::unique_ptr<Command>>;

// make(parent) registers one subcommand under parent (path `prefix`, "" at
// the top) and returns its Command, filed under the subcommand's name.
void add(Commands& cmds, CLI::App& parent, const std::string& prefix,
         std::unique_ptr<Command> (*make)(CLI::App&)) {
  const auto every = [](CLI::App*) { return true; };
  const size_t before = parent.get_subcommands(every).size();
  std::unique_ptr<Command> cmd = make(parent);
  const std::vector<CLI::App*> subs = parent.get_subcommands(every);
  if (subs.size() != before + 1) throw Error("cli: a command registered no subcommand of its own");
  const std::string name =
      prefix.empty() ? subs.back()->get_name() : prefix + " " + subs.back()->get_name();
  if (!cmds.emplace(name, std::move(cmd)).second) throw Error("cli: two commands named " + name);
}

Commands add_commands(CLI::App& app) {
  Commands cmds;
  for (auto make : {add_run_command, add_topo_command, add_plan_command, add_schedule_command})
    add(cmds, app, "", make);
  auto* bench = app.add_subcommand(
      "bench", "Benchmarks: attention | ring | schedule | moe | comm | gemm | step");
  bench->require_subcommand(1);
  for (auto make : {add_bench_attention, add_bench_ring, add_bench_schedule, add_bench_moe,
                    add_bench_comm, add_bench_gemm, add_bench_step})
    add(cmds, *bench, "bench", make);
  auto* convert = app.add_subcommand("convert", "Hugging Face models in and out: hf | to-hf");
  convert->require_subcommand(1);
  for (auto make : {add_convert_hf, add_convert_to_hf}) add(cmds, *convert, "convert", make);
  add(cmds, app, "", add_eval_command);
  return cmds;
}

// Parses the command line; an exit code when that ends the program (help,
// version, a parse error).
std::optional<int> parse(CLI::App& app, int* argc, char*** argv) {
  try {
    app.parse(*argc, *argv);
  } catch (const CLI::CallForHelp& e) {
    return launcher_rank() == 0 ? app.exit(e) : 0;
  } catch (const CLI::CallForAllHelp& e) {
    return launcher_rank() == 0 ? app.exit(e) : 0;
  } catch (const CLI::CallForVersion& e) {
    return launcher_rank() == 0 ? app.exit(e) : 0;
  } catch (const CLI::ParseError& e) {
    // Under a launcher every rank fails the same way, and a rank that exits
    // first makes the launcher kill rank 0 before it prints: the ranks meet
    // and finish together, as for any other input error.
    if (comm_launched()) {
      comm_init(argc, argv);
      return finish_with_error(true, 2, e.what(), true, comm_world_rank() == 0);
    }
    std::fprintf(stderr, "trident: error: %s\n", e.what());
    return 2;
  }
  return std::nullopt;
}

// The chosen command is the one whose subcommand was parsed: the path of
// parsed subcommands from the top, names joined by spaces, is its key in
// cmds. nullptr: none.
Command* chosen_command(CLI::App& app, const Commands& cmds) {
  std::string path;
  for (CLI::App* a = &app;;) {
    auto subs = a->get_subcommands();
    if (subs.empty()) break;
    a = subs.front();
    path += (path.empty() ? "" : " ") + a->get_name();
  }
  const auto it = cmds.find(path);
  return it == cmds.end() ? nullptr : it->second.get();
}

// Runs the command, with the communication runtime when it needs one.
int run_command(Command& chosen, int* argc, char*** argv) {
  bool mpi_on = false;
  try {
    if (chosen.needs_mpi()) {
      comm_init(argc, argv);
      mpi_on = true;
      set_blocking_call_expired(&blocking_call_expired);
    }
    int rc = chosen.run();
    if (mpi_on) comm_finalize();
    return rc;
  } catch (const PeerFailure& e) {
    flight_dump(std::string(e.what()) + " (exit " + std::to_string(e.code) + ")", comm_stopped_s());
    leave_after_reporter(e.code);
  } catch (const InputError& e) {
    const bool lead = (mpi_on ? comm_world_rank() : launcher_rank()) == 0;
    return finish_with_error(mpi_on, 2, e.what(), true, lead);
  } catch (const AgreedError& e) {
    return finish_with_error(mpi_on, 1, e.what(), true, e.reporter);
  } catch (const TimeoutError& e) {
    return finish_with_error(mpi_on, 1, e.what(), false, true, true);
  } catch (const std::exception& e) {
    return finish_with_error(mpi_on, 1, e.what(), false, true);
  }
}

}  // namespace
}  // namespace trident::cli

int main(int argc, char** argv) {
  using namespace trident::cli;
  for (int i = 0; i < argc; ++i) g_command_line += (i ? " " : "") + std::string(argv[i]);

  CLI::App app{"trident: long-context MoE training across a cluster (CP x PP x EP)", "trident"};
  app.set_version_flag("--version", std::string("trident ") + TRIDENT_VERSION);
  app.require_subcommand(1);
  const Commands cmds = add_commands(app);
  if (const std::optional<int> rc = parse(app, &argc, &argv)) return *rc;
  Command* chosen = chosen_command(app, cmds);
  if (!chosen) {
    std::fprintf(stderr, "trident: error: no command chosen (see trident --help)\n");
    return 2;
  }
  return run_command(*chosen, &argc, &argv);
}
