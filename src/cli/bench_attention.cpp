// `trident bench attention`: the flags of the attention kernel benchmark
// (src/bench/attention.cpp measures; trident/bench/attention.hpp says what).
#include "commands.hpp"
#include "list_flags.hpp"
#include "trident/bench/attention.hpp"
#include "trident/core/error.hpp"

namespace trident::cli {
namespace {

class BenchAttentionCommand : public Command {
 public:
  explicit BenchAttentionCommand(CLI::App* app) {
    app->add_option("--seq", seq_, "Sequence lengths, comma-separated");
    app->add_option("--head-dim", head_dim_, "Head dimensions, comma-separated");
    app->add_option("--heads", o_.heads, "Query heads (= kv heads)");
    app->add_option("--mask", masks_, "Masks to measure, comma-separated: full,causal");
    app->add_option("--threads", o_.threads, "BLAS threads");
    app->add_option("--reps", o_.reps, "Timed repetitions per row (best is reported)");
    app->add_option("--sgemm-size", o_.sgemm_n, "Square sgemm size for the ceiling");
    app->add_option("--output", o_.output, "Write the table to this HDF5 file");
    app->add_option("--dtype", dtypes_,
                    "Element types through the tensor ops, comma-separated: f32,bf16 (by CPU "
                    "time; the table attention_dtype instead of the float32 one)");
  }

  bool needs_mpi() const override { return false; }

  int run() override {
    o_.seqs = parse_positive_list("--seq", seq_);
    o_.head_dims = parse_positive_list("--head-dim", head_dim_);
    for (const std::string& m : split_list("--mask", masks_)) {
      if (m != "full" && m != "causal")
        throw InputError("--mask " + masks_ + ": '" + m + "' must be full or causal");
      o_.causal.push_back(m == "causal");
    }
    o_.command_line = command_line();
    if (!dtypes_.empty()) {
      o_.dtypes = split_list("--dtype", dtypes_);
      return bench::run_attention_dtype_bench(o_);
    }
    return bench::run_attention_bench(o_);
  }

 private:
  std::string seq_ = "1024,2048,4096,8192";
  std::string head_dim_ = "64,128";
  std::string masks_ = "full,causal";
  std::string dtypes_;
  bench::AttentionBenchOptions o_;
};

}  // namespace

std::unique_ptr<Command> add_bench_attention(CLI::App& parent) {
  auto* app =
      parent.add_subcommand("attention", "CPU attention kernel GFLOP/s next to sgemm (one rank)");
  return std::make_unique<BenchAttentionCommand>(app);
}
}  // namespace trident::cli
