// The rotary frequencies: pair i of a head of D dimensions turns by
// pos * inv_freq(i) (model.rope_theta and model.rope_scaling), one function
// that the CPU table and the CUDA kernel both evaluate, in double, so that
// every backend and every cp layout rotates a token identically.
//
//   none     inv_freq(i) = theta^(-2i/D)
//   linear   inv_freq(i) / factor            (position interpolation)
//   llama3   Llama 3.1's per-band rule: wavelengths 2 pi / inv_freq shorter
//            than original_max / high_freq_factor are kept, those longer than
//            original_max / low_freq_factor are divided by factor, and the
//            band between blends the two with
//            s = (original_max / wavelength - low) / (high - low):
//            (1 - s) inv_freq / factor + s inv_freq.
#pragma once
#include <math.h>

#include <cstdint>

#include "trident/kernels/host_device.hpp"

namespace trident::kernels {

enum class RopeKind : int { none = 0, linear = 1, llama3 = 2 };

struct RopeFreqs {
  double theta = 10000.0;
  RopeKind kind = RopeKind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max = 8192.0;

  RopeFreqs() = default;
  // A plain base: what every call site that names only theta means.
  RopeFreqs(double base) : theta(base) {}  // NOLINT(google-explicit-constructor)

  TRIDENT_HD bool operator==(const RopeFreqs& o) const {
    return theta == o.theta && kind == o.kind && factor == o.factor &&
           low_freq_factor == o.low_freq_factor && high_freq_factor == o.high_freq_factor &&
           original_max == o.original_max;
  }
};

TRIDENT_HD inline double rope_inv_freq(const RopeFreqs& r, int64_t i, int64_t D) {
  const double base = pow(r.theta, -2.0 * double(i) / double(D));
  if (r.kind == RopeKind::linear) return base / r.factor;
  if (r.kind != RopeKind::llama3) return base;
  const double pi = 3.14159265358979323846;
  const double wavelen = 2.0 * pi / base;
  if (wavelen < r.original_max / r.high_freq_factor) return base;
  if (wavelen > r.original_max / r.low_freq_factor) return base / r.factor;
  const double s =
      (r.original_max / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1.0 - s) * base / r.factor + s * base;
}

}  // namespace trident::kernels
