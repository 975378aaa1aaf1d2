// GEMM entry point: OpenBLAS when available, a reference loop otherwise.
#include "host_params.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/blas.hpp"

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

std::string cpu_gemm_host() {
  const cpu::HostInfo& h = cpu::host_info();
  const cpu::HostCaches& c = h.caches;
  const auto kib = [](int64_t b) { return b > 0 ? std::to_string(b >> 10) + "K" : "?"; };
  return (h.model.empty() ? "unknown CPU" : h.model) + " (" +
         (h.vendor.empty() ? "vendor unknown" : h.vendor) + "); L1d " + kib(c.l1d) + " " +
         std::to_string(c.l1d_ways) + "-way, L2 " + kib(c.l2) + ", L3 " + kib(c.l3) + ", line " +
         std::to_string(c.line) + " (" + c.source + ")";
}

std::string cpu_gemm_params() { return cpu::format_gemm_params(cpu::gemm_params()); }

bool cpu_gemm_params_derived() { return !cpu::gemm_params_overridden(); }

void set_cpu_gemm_params(const std::string& text) {
  cpu::reset_gemm_params();
  if (!text.empty()) cpu::set_gemm_params(cpu::parse_gemm_params(text, cpu::gemm_params()));
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
