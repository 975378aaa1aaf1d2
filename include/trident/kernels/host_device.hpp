// TRIDENT_HD marks a function that both backends compile: __host__
// __device__ under nvcc, nothing for the host compiler. Such functions hold
// arithmetic that the CPU reference and a CUDA kernel must share to the bit
// (tile plans, per-token router maths).
#pragma once

#if defined(__CUDACC__)
#define TRIDENT_HD __host__ __device__
#else
#define TRIDENT_HD
#endif
