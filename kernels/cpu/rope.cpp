// Rotary position embedding. Angles are computed in double from the GLOBAL
// position so that every CP layout rotates a token identically.
#include <cmath>
#include <vector>

#include "trident/kernels/backends.hpp"

namespace trident::kernels::cpu {
namespace {

void rotate(float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D, double theta,
            double sign) {
  const int64_t half = D / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(theta, -2.0 * double(i) / double(D));
  std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(pos[t]) * inv_freq[i];
      c[i] = static_cast<float>(std::cos(a));
      s[i] = static_cast<float>(sign * std::sin(a));
    }
    for (int64_t h = 0; h < H; ++h) {
      float* v = x + (t * H + h) * D;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = a * s[i] + b * c[i];
      }
    }
  }
}

}  // namespace

void rope_forward(const Ctx& ctx, float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                  double theta) {
  rotate(x, pos, T, H, D, theta, 1.0);
}

void rope_backward(const Ctx& ctx, float* dx, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                   double theta) {
  rotate(dx, pos, T, H, D, theta, -1.0);
}

}  // namespace trident::kernels::cpu
