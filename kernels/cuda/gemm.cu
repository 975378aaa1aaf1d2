// GEMMs through cuBLAS (row-major on top of its column-major API), the
// linear layer, the SwiGLU MLP and the grouped expert GEMM built on them.
#include <string>

#include "common.cuh"

namespace trident::kernels::cuda {
namespace {

int to_int(int64_t v, const char* what) {
  TRIDENT_CHECK(plan::fits_int32(v), std::string("cuBLAS GEMM: ") + what + " = " +
                                         std::to_string(v) + " does not fit in 32 bits");
  return int(v);
}

// One GemmEx call: types of A/B and C, fp32 accumulation, and the math
// (plan::gemm_math) set on the handle for this call, since the handle is
// shared by fp32 and bf16 GEMMs and a mode left over from one must not
// decide the other.
void gemm_ex(const Ctx& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             const void* A, int64_t lda, const void* B, int64_t ldb, float beta, void* C,
             int64_t ldc, cudaDataType_t ab, cudaDataType_t ct) {
  if (M == 0 || N == 0) return;
  const plan::ColumnMajorGemm g = plan::column_major(trans_a, trans_b, M, N, K);
  const GemmMath math = gemm_math(ab == CUDA_R_32F, c.tf32);
  cublasHandle_t h = blas_of(c);
  CUBLAS_CHECK(cublas().set_math_mode(h, math.mode));
  CUBLAS_CHECK(cublas().gemm_ex(
      h, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N,
      to_int(g.m, "N"), to_int(g.n, "M"), to_int(g.k, "K"), &alpha, B, ab, to_int(ldb, "ldb"), A,
      ab, to_int(lda, "lda"), &beta, C, ct, to_int(ldc, "ldc"), math.compute, CUBLAS_GEMM_DEFAULT));
}

__global__ void swiglu_gate_kernel(const float* gate, const float* up, int64_t n, float* h) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float a = gate[i], s = 1.0f / (1.0f + expf(-a));
    h[i] = a * s * up[i];
  }
}

// From dh = dy·Wdᵀ: d(gate) into dgate, d(up) in place of dh.
__global__ void swiglu_gate_backward_kernel(const float* gate, const float* up, int64_t n,
                                            float* dh, float* dgate) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float a = gate[i], s = 1.0f / (1.0f + expf(-a)), g = dh[i];
    dgate[i] = g * up[i] * s * (1.0f + a * (1.0f - s));
    dh[i] = g * a * s;
  }
}

}  // namespace

void sgemm(const Ctx& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  gemm_ex(c, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, CUDA_R_32F,
          CUDA_R_32F);
}

void gemm_bf16(const Ctx& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               float alpha, const Bf16* A, int64_t lda, const Bf16* B, int64_t ldb, float beta,
               float* C, int64_t ldc) {
  gemm_ex(c, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, CUDA_R_16BF,
          CUDA_R_32F);
}

void gemm_bf16_out(const Ctx& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const Bf16* A, int64_t lda, const Bf16* B, int64_t ldb, float beta,
                   Bf16* C, int64_t ldc) {
  gemm_ex(c, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, CUDA_R_16BF,
          CUDA_R_16BF);
}

void linear_forward(const Ctx& c, const float* x, const float* w, int64_t T, int64_t in,
                    int64_t out, float* y) {
  cuda::sgemm(c, false, true, T, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void linear_backward_input(const Ctx& c, const float* dy, const float* w, int64_t T, int64_t in,
                           int64_t out, float* dx, float beta) {
  cuda::sgemm(c, false, false, T, in, out, 1.0f, dy, out, w, in, beta, dx, in);
}

void linear_backward_weight(const Ctx& c, const float* dy, const float* x, int64_t T, int64_t in,
                            int64_t out, float* dw) {
  if (T == 0) return;
  cuda::sgemm(c, true, false, out, in, T, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

void swiglu_forward(const Ctx& c, const float* x, int64_t T, int64_t d, int64_t f,
                    const float* w_gate, const float* w_up, const float* w_down, float* y,
                    float* gate, float* up) {
  if (T == 0) return;
  cuda::linear_forward(c, x, w_gate, T, d, f, gate);
  cuda::linear_forward(c, x, w_up, T, d, f, up);
  Scratch h(c, size_t(T * f) * sizeof(float));
  swiglu_gate_kernel<<<plan::grid_for(T * f), plan::kThreads, 0, stream_of(c)>>>(gate, up, T * f,
                                                                                 h.as<float>());
  CUDA_CHECK_LAUNCH();
  cuda::linear_forward(c, h.as<float>(), w_down, T, f, d, y);
}

void swiglu_backward(const Ctx& c, const float* x, const float* gate, const float* up,
                     const float* dy, int64_t T, int64_t d, int64_t f, const float* w_gate,
                     const float* w_up, const float* w_down, float* dx, float* dw_gate,
                     float* dw_up, float* dw_down) {
  if (T == 0) return;
  const int64_t n = T * f;
  Scratch buf(c, size_t(2 * n) * sizeof(float));
  float* h = buf.as<float>();
  float* dh = h + n;
  swiglu_gate_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(gate, up, n, h);
  CUDA_CHECK_LAUNCH();
  cuda::linear_backward_weight(c, dy, h, T, f, d, dw_down);
  cuda::linear_backward_input(c, dy, w_down, T, f, d, dh, 0.0f);
  // h is free again: it receives d(gate).
  swiglu_gate_backward_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(gate, up, n,
                                                                                      dh, h);
  CUDA_CHECK_LAUNCH();
  cuda::linear_backward_weight(c, h, x, T, d, f, dw_gate);
  cuda::linear_backward_weight(c, dh, x, T, d, f, dw_up);
  if (dx) {
    cuda::linear_backward_input(c, h, w_gate, T, d, f, dx, 0.0f);
    cuda::linear_backward_input(c, dh, w_up, T, d, f, dx, 1.0f);
  }
}

void grouped_gemm(const Ctx& c, const float* x, const float* const* w, const int64_t* offsets,
                  int E, int64_t in, int64_t out, float beta, float* y) {
  for (int e = 0; e < E; ++e) {
    const int64_t rows = offsets[e + 1] - offsets[e];
    TRIDENT_CHECK(rows >= 0, "grouped_gemm: offsets must not decrease");
    if (rows == 0) continue;
    cuda::sgemm(c, false, true, rows, out, in, 1.0f, x + offsets[e] * in, in, w[e], in, beta,
                y + offsets[e] * out, out);
  }
}

}  // namespace trident::kernels::cuda
