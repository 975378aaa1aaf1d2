// CUDA_CHECK and CUDA_CHECK_LAUNCH: a failed CUDA runtime call throws
// trident::Error naming file:line, the call and the runtime's own message
// (cudaGetErrorName, cudaGetErrorString), as the CPU side has TRIDENT_CHECK.
// Public (scripts/check-layering.py) because code above kernels/ that calls
// the CUDA runtime itself checks its calls with it: the NCCL communicator
// (src/comm/nccl). It needs the runtime's header only, never cuBLAS (the
// internal kernels/cuda/check.hpp adds CUBLAS_CHECK for the CUDA backend).
// CUDA builds only; never included by CPU-only code.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "trident/core/error.hpp"

namespace trident::kernels::cuda {

[[noreturn]] inline void throw_cuda(const char* file, int line, const char* call, cudaError_t e) {
  ::trident::throw_error(
      file, line, std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace trident::kernels::cuda

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    const cudaError_t trident_cuda_err_ = (call);                                         \
    if (trident_cuda_err_ != cudaSuccess)                                                 \
      ::trident::kernels::cuda::throw_cuda(__FILE__, __LINE__, #call, trident_cuda_err_); \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration), not the
// kernel's outcome, which surfaces at the next synchronisation.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
