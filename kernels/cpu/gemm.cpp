// GEMM entry point: OpenBLAS when available, a reference loop otherwise.
#include "trident/kernels/backends.hpp"

#ifdef TRIDENT_HAVE_BLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int);
extern "C" char* openblas_get_corename(void);
#endif

namespace trident::kernels {

bool have_blas() {
#ifdef TRIDENT_HAVE_BLAS
  return true;
#else
  return false;
#endif
}

void set_blas_threads(int n) {
#ifdef TRIDENT_HAVE_BLAS
  openblas_set_num_threads(n);
#else
  (void)n;
#endif
}

std::string blas_kernels() {
#ifdef TRIDENT_HAVE_BLAS
  const char* core = openblas_get_corename();
  return std::string("OpenBLAS ") + (core ? core : "(kernels unknown)");
#else
  return "none (reference loops)";
#endif
}

}  // namespace trident::kernels

namespace trident::kernels::cpu {

void sgemm(const Ctx& ctx, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  if (M == 0 || N == 0) return;
#ifdef TRIDENT_HAVE_BLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M),
              int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
#else
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        float a = ta ? A[k * lda + i] : A[i * lda + k];
        float b = tb ? B[j * ldb + k] : B[k * ldb + j];
        acc += a * b;
      }
      C[i * ldc + j] = alpha * acc + (beta == 0.0f ? 0.0f : beta * C[i * ldc + j]);
    }
  }
#endif
}

}  // namespace trident::kernels::cpu
