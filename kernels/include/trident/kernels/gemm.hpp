// GEMM: C = alpha * op(A) * op(B) + beta * C, row-major float32.
//
// OpenBLAS's cblas_sgemm where it was found at build time, otherwise a plain
// blocked loop (so the CPU reference kernels build with nothing but a C++
// compiler, e.g. on the GPU machine). The kernels' GEMM: train, parallel,
// plan and cli code multiply through the tensor ops (functional.hpp), and
// set the BLAS up through blas.hpp; the benches time it directly.
#pragma once
#include <cstdint>

#include "trident/kernels/blas.hpp"
#include "trident/kernels/context.hpp"

namespace trident::kernels {

// op(A) is M x K, op(B) is K x N, C is M x N; lda/ldb/ldc are row strides.
void sgemm(const Ctx& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc);

}  // namespace trident::kernels
