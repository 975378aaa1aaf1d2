// CUDA_CHECK and CUBLAS_CHECK: one error check per library, as the CPU side
// has TRIDENT_CHECK. A failed call throws trident::Error naming file:line,
// the call and the library's own message (cudaGetErrorString,
// cublasGetStatusString). Included by the CUDA backend's sources. CUDA_CHECK
// and CUDA_CHECK_LAUNCH are in the public kernels/cuda_check.hpp (the NCCL
// communicator, above kernels/, checks its runtime calls with it); this
// internal header adds cuBLAS's.
#pragma once
#include <string>

#include "trident/core/error.hpp"
#include "trident/kernels/cuda/cublas_api.hpp"
#include "trident/kernels/cuda_check.hpp"

namespace trident::kernels::cuda {

[[noreturn]] inline void throw_cublas(const char* file, int line, const char* call,
                                      cublasStatus_t s) {
  ::trident::throw_error(
      file, line,
      std::string(call) + ": " + cublas().status_name(s) + ": " + cublas().status_string(s));
}

}  // namespace trident::kernels::cuda

#define CUBLAS_CHECK(call)                                                                   \
  do {                                                                                       \
    const cublasStatus_t trident_cublas_st_ = (call);                                        \
    if (trident_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::trident::kernels::cuda::throw_cublas(__FILE__, __LINE__, #call, trident_cublas_st_); \
  } while (0)
