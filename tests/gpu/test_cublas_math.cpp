// The cuBLAS math of every GEMM, checked without a device through the
// function table (set_cublas_for_testing): a fake cuBLAS records the math
// mode set on the handle and the compute type of each cublasGemmEx. fp32
// GEMMs must run pedantic (no TF32) unless the Ctx allows TF32 (train.tf32),
// bf16 GEMMs on the tensor cores (default math, fp32 accumulation), and
// each call must set its own mode, whatever the call before it left.
// Exit 0 when every check holds, 1 otherwise.
#include <cstdio>
#include <string>
#include <vector>

#include "harness.hpp"
#include "trident/kernels/cuda/cublas_api.hpp"
#include "trident/kernels/cuda/ops.hpp"

namespace cuda = trident::kernels::cuda;
using gpu_test::expect;

namespace {

// What the fake saw: the mode last set on the handle, and per GEMM that mode
// (or "none" when no mode was set since the previous GEMM), its compute type
// and operand type.
struct Seen {
  bool mode_set = false;
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
  struct Gemm {
    bool mode_set;
    cublasMath_t mode;
    cublasComputeType_t compute;
    cudaDataType ab, c;
  };
  std::vector<Gemm> gemms;
};
Seen seen;

cublasStatus_t fake_set_math_mode(cublasHandle_t, cublasMath_t mode) {
  seen.mode_set = true;
  seen.mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t fake_gemm_ex(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType ab, int, const void*,
                            cudaDataType, int, const void*, void*, cudaDataType c, int,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  seen.gemms.push_back({seen.mode_set, seen.mode, compute, ab, c});
  seen.mode_set = false;
  return CUBLAS_STATUS_SUCCESS;
}

const char* fake_status(cublasStatus_t) { return "fake"; }

// The last GEMM ran with the expected mode, set for it, and compute type.
void expect_last(const std::string& what, cublasMath_t mode, cublasComputeType_t compute) {
  if (seen.gemms.empty()) {
    expect(false, what + ": no cublasGemmEx call");
    return;
  }
  const Seen::Gemm g = seen.gemms.back();
  expect(g.mode_set, what + ": no math mode set on the handle for this GEMM");
  expect(g.mode == mode, what + ": math mode " + std::to_string(int(g.mode)) + ", want " +
                             std::to_string(int(mode)));
  expect(g.compute == compute, what + ": compute type " + std::to_string(int(g.compute)) +
                                   ", want " + std::to_string(int(compute)));
  std::printf("    %s: mode %d, compute %d, operands %d\n", what.c_str(), int(g.mode),
              int(g.compute), int(g.ab));
}

}  // namespace

int main() {
  cuda::CublasApi api{};
  api.set_math_mode = fake_set_math_mode;
  api.gemm_ex = fake_gemm_ex;
  api.status_name = fake_status;
  api.status_string = fake_status;
  cuda::set_cublas_for_testing(&api);

  // No memory is touched: the fake only records; any non-null handle and
  // pointers do.
  int handle = 0;
  float f[64] = {};
  cuda::Bf16 h[64] = {};
  trident::kernels::Ctx c;
  c.device = trident::Device::cuda(0);
  c.blas = &handle;
  for (bool tf32 : {false, true}) {
    c.tf32 = tf32;
    const std::string tag = tf32 ? " (train.tf32)" : "";
    const auto fp32_mode = tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH;
    const auto fp32_compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F_PEDANTIC;
    cuda::sgemm(c, false, true, 4, 5, 6, 1.0f, f, 6, f, 6, 0.0f, f, 5);
    expect_last("sgemm" + tag, fp32_mode, fp32_compute);
    cuda::gemm_bf16(c, false, true, 4, 5, 6, 1.0f, h, 6, h, 6, 0.0f, f, 5);
    expect_last("gemm_bf16" + tag, CUBLAS_DEFAULT_MATH, CUBLAS_COMPUTE_32F);
    cuda::linear_forward(c, f, f, 4, 6, 5, f);  // after a bf16 GEMM: fp32's mode again
    expect_last("linear_forward after gemm_bf16" + tag, fp32_mode, fp32_compute);
    cuda::gemm_bf16_out(c, true, false, 4, 5, 6, 1.0f, h, 4, h, 5, 0.0f, h, 5);
    expect_last("gemm_bf16_out" + tag, CUBLAS_DEFAULT_MATH, CUBLAS_COMPUTE_32F);
    cuda::linear_backward_weight(c, f, f, 4, 6, 5, f);
    expect_last("linear_backward_weight" + tag, fp32_mode, fp32_compute);
  }
  cuda::set_cublas_for_testing(nullptr);
  const int failed = gpu_test::failures();
  std::printf("%zu GEMMs seen, %d checks failed\n", seen.gemms.size(), failed);
  return failed ? 1 : 0;
}
