// cuBLAS, loaded with dlopen the first time a CUDA stream context needs it.
//
// Linking libcublas makes the loader map and relocate cuBLASLt as the
// process starts, about 210 MB of resident memory per process, which every
// CPU-only run of the same binary (8 ranks: 1.7 GB) would pay for nothing.
// The CUDA backend calls the few functions it uses through this table
// instead. Included by the CUDA backend's sources only.
#pragma once
#include <cublas_v2.h>

namespace trident::kernels::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  // The C entry point (the headers add an inline C++ overload taking a
  // cudaDataType compute type).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// The math of one GEMM, set on the handle before every call (the handle is
// shared by fp32 and bf16 GEMMs): fp32 operands pedantic, so never TF32
// whatever NVIDIA_TF32_OVERRIDE says (the parity runs against the CPU need
// fp32), or TF32 on the tensor cores where the Ctx allows it (train.tf32);
// bf16 operands on the tensor cores (default math: the pedantic mode would
// keep them off), accumulating in fp32.
struct GemmMath {
  cublasMath_t mode;
  cublasComputeType_t compute;
};
constexpr GemmMath gemm_math(bool fp32_operands, bool tf32) {
  if (!fp32_operands) return {CUBLAS_DEFAULT_MATH, CUBLAS_COMPUTE_32F};
  if (tf32) return {CUBLAS_TF32_TENSOR_OP_MATH, CUBLAS_COMPUTE_32F_FAST_TF32};
  return {CUBLAS_PEDANTIC_MATH, CUBLAS_COMPUTE_32F_PEDANTIC};
}

// Loads libcublas.so.<major of the headers> on the first call (from the
// library path, else from the directory of the CUDA runtime this process
// uses; the environment variable TRIDENT_CUBLAS_LIBRARY, when set, names the
// one file to load instead); throws trident::Error naming the library and
// the loader's reason, in one line, when it is not there or lacks a function.
const CublasApi& cublas();

// Tests: makes cublas() return `fake` instead of the library's table (null:
// the library's again), so that a CPU test sees the calls the kernels make
// without a device (tests/gpu/test_cublas_math.cpp).
void set_cublas_for_testing(const CublasApi* fake);

}  // namespace trident::kernels::cuda
