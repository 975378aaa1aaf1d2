// The fixed-order double reductions of vector_math.hpp.
#include "vector_math.hpp"

namespace trident::kernels::cpu {
namespace {

constexpr int kLanes = 8;

inline double fold(const double* acc) {
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace

TRIDENT_CPU_CLONES double sum_d(const float* x, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += double(x[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] += double(x[i + j]);
  return fold(acc);
}

TRIDENT_CPU_CLONES double sum_squares_d(const float* x, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += double(x[i + j]) * double(x[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] += double(x[i + j]) * double(x[i + j]);
  return fold(acc);
}

TRIDENT_CPU_CLONES double dot_d(const float* a, const float* b, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += double(a[i + j]) * double(b[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] += double(a[i + j]) * double(b[i + j]);
  return fold(acc);
}

TRIDENT_CPU_CLONES double dot3_d(const float* x, const float* y, const float* z, int64_t n) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j)
      acc[j] += double(x[i + j]) * double(y[i + j]) * double(z[i + j]);
  for (int j = 0; i + j < n; ++j) acc[j] += double(x[i + j]) * double(y[i + j]) * double(z[i + j]);
  return fold(acc);
}

}  // namespace trident::kernels::cpu
