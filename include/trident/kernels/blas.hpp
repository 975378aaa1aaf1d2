// The host BLAS's process settings: what a command sets before it computes
// (the threads it may use) and what a report names (which BLAS, which
// kernels). No GEMM here: layers above kernels/ multiply through the tensor
// ops (functional.hpp), and kernels/ through gemm.hpp.
#pragma once
#include <string>

namespace trident::kernels {

// Number of threads the BLAS uses (1 keeps ranks from fighting over cores).
void set_blas_threads(int n);
bool have_blas();
// The BLAS and the kernels it runs on this machine ("OpenBLAS Cooperlake"),
// for benchmark tables: OPENBLAS_CORETYPE can force narrower kernels than the
// CPU has (a Zen 5 sandbox set Haswell: half the sgemm rate), and a ceiling
// measured with them is not the machine's.
std::string blas_kernels();
// The CPU's bf16 GEMMs on this machine: "native (AVX512-BF16)" or "staged
// (...)" (cpu-kernels.md#native-bf16). The first call reads
// TRIDENT_CPU_BF16: a bad value, or "native" on a CPU without AVX512-BF16,
// throws InputError.
std::string cpu_bf16_kernels();
// Chooses the CPU's bf16 path of this process from now on, as
// TRIDENT_CPU_BF16 does at start-up (its values): "staged" (every bf16 op
// widens, runs the f32 kernel and rounds: the reference bits), "native" (the
// AVX512-BF16 kernels), "auto" (native where the CPU has AVX512-BF16), or ""
// (back to what TRIDENT_CPU_BF16 says). Every bf16 op reads the path when it
// runs, so a benchmark may alternate paths between steps in one process
// (`trident bench step --precision bf16_staged,bf16_native`); set it between
// ops, not while another thread runs one. Throws InputError for another
// value, or "native" on a CPU without AVX512-BF16 (nothing changed then).
// cpu_bf16_kernels() names a staged path chosen here "staged (chosen at run
// time)".
void set_cpu_bf16_path(const std::string& path);

// The CPU the fp32 GEMMs were set up for and its caches, as read at start-up
// ("AMD EPYC 9454 (AuthenticAMD); L1d 32K 8-way, L2 1024K, L3 32768K, line
// 64 (sysfs)"; cpu-kernels.md#host-parameters).
std::string cpu_gemm_host();
// The fp32 GEMMs' parameters in use ("direct=1024K,kc=1024,mc=0,prefetch=8,
// nt_rows=16"). The first call reads TRIDENT_CPU_GEMM_BLOCKS: a bad value
// throws InputError naming it and the rule.
std::string cpu_gemm_params();
// Whether they are the rules' (false: TRIDENT_CPU_GEMM_BLOCKS set them).
bool cpu_gemm_params_derived();
// The start-up parameters with the keys of `text` (TRIDENT_CPU_GEMM_BLOCKS's
// form, "prefetch=12,mc=64") replaced, from now on; "" goes back to the
// start-up's. For measuring (`trident bench gemm --sweep`): between ops, not
// while another thread runs one. Throws InputError for a bad key or value.
void set_cpu_gemm_params(const std::string& text);

}  // namespace trident::kernels
