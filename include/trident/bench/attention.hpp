// `trident bench attention`: GFLOP/s of the CPU flash-attention kernel,
// forward and forward+backward, next to OpenBLAS sgemm measured just before
// each row in the same process (the practical ceiling, and a guard against a
// machine whose load changes during the run). One process, no MPI.
//
// Every row's forward output is spot-checked against the fp64 definition on
// a few query rows; rows off by more than 1e-4 are counted in #wrong and make
// the exit code 1.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/kernels/types/attention.hpp"

namespace trident::bench {

struct AttentionBenchOptions {
  std::vector<int64_t> seqs, head_dims;  // one row per (mask, head_dim, seq)
  std::vector<bool> causal;              // the masks: false full, true causal
  int heads = 1, threads = 1, reps = 1;
  int64_t sgemm_n = 2048;
  std::string output;        // HDF5 file, "" none
  std::string command_line;  // recorded in the file
  // --dtype: "f32", "bf16" (empty: the float32 table above). Given, the
  // table attention_dtype instead: the attention through the tensor ops on
  // tensors of each element type (bf16: the CPU's native bf16 attention on
  // AVX512-BF16, else the staged path, named), forward and forward +
  // backward by the calling thread's CPU time and wall time, each row set
  // beside the f32 row of its shape; outputs spot-checked against the fp64
  // attention of the rounded inputs (1e-4 f32, 1e-2 bf16).
  std::vector<std::string> dtypes;
};

// Throws InputError naming the flag for a bad value; prints the table and the
// verdict; returns the exit code.
int run_attention_bench(const AttentionBenchOptions& opt);
// The same for opt.dtypes (src/bench/attention_dtype.cpp).
int run_attention_dtype_bench(const AttentionBenchOptions& opt);
// The shape of one row of either table: T queries and keys, opt.heads query
// and kv heads of D, scale 1/sqrt(D), causal or full.
kernels::AttnShape attention_row_shape(const AttentionBenchOptions& opt, bool causal, int64_t D,
                                       int64_t T);

}  // namespace trident::bench
