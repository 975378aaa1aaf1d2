// CUDA_CHECK and CUBLAS_CHECK: one error check per library, as the CPU side
// has TRIDENT_CHECK. A failed call throws trident::Error naming file:line,
// the call and the library's own message (cudaGetErrorString,
// cublasGetStatusString). Included by the CUDA backend's sources and the
// NCCL communicator's (comm sits above kernels), never by CPU-only code.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "trident/core/error.hpp"
#include "trident/kernels/cuda/cublas_api.hpp"

namespace trident::kernels::cuda {

[[noreturn]] inline void throw_cuda(const char* file, int line, const char* call, cudaError_t e) {
  ::trident::throw_error(
      file, line, std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

[[noreturn]] inline void throw_cublas(const char* file, int line, const char* call,
                                      cublasStatus_t s) {
  ::trident::throw_error(
      file, line,
      std::string(call) + ": " + cublas().status_name(s) + ": " + cublas().status_string(s));
}

}  // namespace trident::kernels::cuda

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    const cudaError_t trident_cuda_err_ = (call);                                         \
    if (trident_cuda_err_ != cudaSuccess)                                                 \
      ::trident::kernels::cuda::throw_cuda(__FILE__, __LINE__, #call, trident_cuda_err_); \
  } while (0)

#define CUBLAS_CHECK(call)                                                                   \
  do {                                                                                       \
    const cublasStatus_t trident_cublas_st_ = (call);                                        \
    if (trident_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::trident::kernels::cuda::throw_cublas(__FILE__, __LINE__, #call, trident_cublas_st_); \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration), not the
// kernel's outcome, which surfaces at the next synchronisation.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
