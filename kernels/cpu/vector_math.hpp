// Vectorised element-wise math for the CPU kernels.
//
// The transcendental functions come from glibc's libmvec (vector expf, the
// AVX-512, AVX2 and SSE variants GCC calls from loops marked `omp simd`;
// libmvec's contract is at most 4 ulp, and a check over [-87, 87] measured
// at most 2 ulp against the correctly rounded value). Loops that use it are
// compiled once per instruction set (TRIDENT_CPU_CLONES) and the variant is
// picked when the program loads, so one binary runs on any x86-64 and uses
// the widest vectors the machine has. Without GCC on x86-64 glibc the same
// loops fall back to scalar std::exp.
//
// Bits: the arithmetic is the same IEEE operations in the same order in every
// variant (no FMA contraction: none of the variants enables FMA), so results
// differ between machines only by libmvec's expf, and between this code and
// a scalar loop by at most those few ulp of exp.
#pragma once
#include <cmath>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__)
// Tells GCC that libmvec has vector variants of expf (glibc declares them
// only under -ffast-math, which the kernels do not use).
extern "C" float expf(float) noexcept __attribute__((simd("notinbranch")));
#define TRIDENT_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
// The build that compiles kernels/cpu with -fopenmp-simd says so (CMakeLists.txt);
// another (tests/gpu's standalone build) gets plain loops and no unknown pragma.
#ifdef TRIDENT_OPENMP_SIMD
#define TRIDENT_SIMD _Pragma("omp simd")
#else
#define TRIDENT_SIMD
#endif
#define TRIDENT_HAVE_LIBMVEC 1
namespace trident::kernels::cpu {
inline float vexp(float x) { return ::expf(x); }
}  // namespace trident::kernels::cpu
#else
#define TRIDENT_CPU_CLONES
#define TRIDENT_SIMD
namespace trident::kernels::cpu {
inline float vexp(float x) { return std::exp(x); }
}  // namespace trident::kernels::cpu
#endif

#include <cstdint>

namespace trident::kernels::cpu {

// Sums in double over eight interleaved lanes (element i goes to lane i % 8),
// the lanes added pairwise at the end: a fixed order, the same on every
// machine and instruction set, that vectorises (a single index-order chain
// does not). Used where a row statistic or a norm needs double accumulation.
double sum_d(const float* x, int64_t n);
double sum_squares_d(const float* x, int64_t n);
double dot_d(const float* a, const float* b, int64_t n);
// sum of x[i] * y[i] * z[i]
double dot3_d(const float* x, const float* y, const float* z, int64_t n);

}  // namespace trident::kernels::cpu
