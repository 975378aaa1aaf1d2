// `trident bench gemm`: the flags of the linear layers' GEMM benchmark
// (src/bench/gemm.cpp measures; trident/bench/gemm.hpp says what).
#include "commands.hpp"
#include "list_flags.hpp"
#include "trident/bench/gemm.hpp"
#include "trident/core/config.hpp"

namespace trident::cli {
namespace {

class BenchGemmCommand : public Command {
 public:
  explicit BenchGemmCommand(CLI::App* app) {
    app->add_option("config", config_path_,
                    "Config file (TOML): the shapes of its model's linear layers; none: only "
                    "--sizes");
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--tokens", o_.tokens,
                    "Rows T of the model's shapes (default micro_batch_size x seq_len)");
    app->add_option("--sizes", sizes_, "Square M = N = K cases, comma-separated");
    app->add_option("--dtype", dtypes_, "Element types, comma-separated: f32,bf16");
    app->add_option("--ops", ops_, "Comma-separated: forward,input_grad,weight_grad");
    app->add_option("--reps", o_.reps, "Timed calls per row (the best is reported)");
    app->add_option("--threads", o_.threads, "BLAS threads");
    app->add_option("--output", o_.output, "Write the table to this HDF5 file");
    app->add_flag("--sweep", o_.sweep,
                  "f32: time each op under a grid of the fp32 GEMMs' block sizes and prefetch "
                  "distances against sgemm (cpu-kernels.md#host-parameters)");
  }

  bool needs_mpi() const override { return false; }

  int run() override {
    o_.use_config = !config_path_.empty();
    const Config cfg = load_config(config_path_, sets_);
    if (!sizes_.empty()) o_.sizes = parse_positive_list("--sizes", sizes_);
    o_.dtypes = split_list("--dtype", dtypes_);
    o_.ops = split_list("--ops", ops_);
    o_.command_line = command_line();
    return bench::run_gemm_bench(cfg, o_);
  }

 private:
  std::string config_path_, sizes_, dtypes_ = "f32,bf16", ops_ = "forward,input_grad,weight_grad";
  std::vector<std::string> sets_;
  bench::GemmBenchOptions o_;
};

}  // namespace

std::unique_ptr<Command> add_bench_gemm(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "gemm", "Linear layers' GEMMs in f32 and bf16 through the tensor ops (one process)");
  return std::make_unique<BenchGemmCommand>(app);
}
}  // namespace trident::cli
