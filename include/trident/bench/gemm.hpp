// `trident bench gemm`: GFLOP/s of the linear layers' GEMMs through the tensor
// ops (kernels/functional.hpp: linear_forward, linear_backward_input,
// linear_backward_weight) in f32 and in bf16, by wall time and by the CPU
// time of the calling thread, one process, no MPI.
//
// The shapes: every linear layer of a config's model (T = the tokens of one
// micro-batch, micro_batch_size x seq_len, or --tokens; the MoE experts with
// their average routed rows, T x top_k / n_experts) and square sizes (--sizes).
// The bf16 rows run whatever the CPU's bf16 path is in this process (native on
// AVX512-BF16, else staged; TRIDENT_CPU_BF16 picks it), named in the path
// column; each is set beside the f32 op of the same shape (the host's sgemm or
// trident's direct GEMM, the one training runs) as a ratio of CPU-time rates.
//
// Every run prints the host (CPU model, caches, BLAS kernels) and the fp32
// GEMMs' parameters first. With --sweep (f32 only) each layer's ops are timed
// under a grid of parameters around those in use (sgemm alone, trident's own
// kernel with one parameter moved at a time) and the fastest per op is set
// beside sgemm (tables gemm_sweep, gemm_sweep_best).
//
// Checked: every row's output is compared on a few rows with the fp64 sum of
// the inputs it was given (for bf16 the rounded inputs: bf16 tensors widen
// exactly); a row off by more than the tolerance in relative L2 counts in
// #wrong and makes the exit code 1.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/core/config.hpp"

namespace trident::bench {

struct GemmBenchOptions {
  bool use_config = false;     // shapes of cfg's model (a config was given)
  int64_t tokens = 0;          // T of the model's shapes; 0: micro_batch_size x seq_len
  std::vector<int64_t> sizes;  // square M = N = K cases
  std::vector<std::string> dtypes{"f32", "bf16"};
  std::vector<std::string> ops{"forward", "input_grad", "weight_grad"};
  int reps = 3, threads = 1;
  // f32 only: every layer's ops under a grid of the fp32 GEMMs' parameters
  // (tables gemm_sweep and gemm_sweep_best; cpu-kernels.md#host-parameters)
  bool sweep = false;
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
};

// Throws InputError naming the flag for a bad value (before measuring);
// prints the table and the verdict; returns the exit code.
int run_gemm_bench(const Config& cfg, const GemmBenchOptions& opt);

}  // namespace trident::bench
