// Tensor helpers and the difference measures used by parity tests.
#include "trident/core/tensor.hpp"

#include <algorithm>
#include <cmath>

namespace trident {

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

double max_rel_diff(const float* a, const float* b, int64_t n, double floor) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = std::fabs(double(a[i]) - double(b[i]));
    double s = std::max(std::fabs(double(b[i])), floor);
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, d / s);
  }
  return worst;
}

double rel_l2_diff(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  if (std::isnan(num)) return INFINITY;
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

}  // namespace trident
