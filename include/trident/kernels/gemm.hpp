// GEMM: C = alpha * op(A) * op(B) + beta * C, row-major float32.
//
// OpenBLAS's cblas_sgemm where it was found at build time, otherwise a plain
// blocked loop (so the CPU reference kernels build with nothing but a C++
// compiler, e.g. on the GPU machine). All layers call GEMMs through here.
#pragma once
#include <cstdint>
#include <string>

#include "trident/kernels/context.hpp"

namespace trident::kernels {

// op(A) is M x K, op(B) is K x N, C is M x N; lda/ldb/ldc are row strides.
void sgemm(const Ctx& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc);

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

}  // namespace trident::kernels
