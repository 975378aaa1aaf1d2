// The subcommands of `trident`. Each file src/cli/<name>.cpp adds its
// subcommand (with options and --help text) to the parser and returns a
// Command that main runs once parsing succeeded. Errors travel up as
// exceptions to main, which prints one line and picks the exit code.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

namespace trident::cli {

class Command {
 public:
  virtual ~Command() = default;
  // True if run() needs MPI initialised (run, topo, and the MPI benches).
  virtual bool needs_mpi() const = 0;
  // Exit code of the command (0 success). Throws InputError / Error.
  virtual int run() = 0;
};

// Each adds `name` under parent and returns the Command bound to its options.
std::unique_ptr<Command> add_run_command(CLI::App& app);
std::unique_ptr<Command> add_topo_command(CLI::App& app);
std::unique_ptr<Command> add_plan_command(CLI::App& app);
std::unique_ptr<Command> add_schedule_command(CLI::App& app);
std::unique_ptr<Command> add_eval_command(
    CLI::App& app);  // validation loss, logits of given tokens

// `trident bench KIND`: each kind registers below the bench subcommand.
std::unique_ptr<Command> add_bench_attention(CLI::App& bench);  // CP kernels (one rank)
std::unique_ptr<Command> add_bench_ring(CLI::App& bench);       // ring attention (mpirun)
std::unique_ptr<Command> add_bench_schedule(CLI::App& bench);   // pipeline executor (mpirun)
std::unique_ptr<Command> add_bench_moe(CLI::App& bench);        // dispatch/combine (mpirun)
std::unique_ptr<Command> add_bench_comm(CLI::App& bench);       // collectives (mpirun)
std::unique_ptr<Command> add_bench_gemm(CLI::App& bench);       // linear GEMMs f32/bf16 (one rank)
std::unique_ptr<Command> add_bench_step(CLI::App& bench);       // training step f32/bf16 (one rank)

// `trident convert hf | to-hf`: Hugging Face models in and out (one process).
std::unique_ptr<Command> add_convert_hf(CLI::App& convert);
std::unique_ptr<Command> add_convert_to_hf(CLI::App& convert);

// The process's rank as the launcher sets it (before MPI starts), 0 if none.
int launcher_rank();
// The command line as one string (recorded in output files).
const std::string& command_line();

}  // namespace trident::cli
