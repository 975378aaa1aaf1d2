// The harness's host-side checks and data (harness.hpp): no CUDA call, so
// the CPU test of the bf16 bounds (test_bf16_bounds.cpp) runs them without a
// device.
//
// The bf16 bounds. The tests give the CPU reference the bf16-rounded inputs,
// so only what the GPU rounds after reading them differs. bf16 has 8
// significant bits; rounding to nearest even moves x by at most half a unit
// in its last place, 2^-8 |x| (u = 2^-8), so a result stored once is off by
// at most u of the largest reference value in the norm-wise measure
// (kBf16Stored). Two results rounded independently from fp32 values that
// differ in their last fp32 bits (the GPU's and the CPU's summation orders)
// can land on neighbouring bf16 values: a whole unit apart, up to 2u of the
// value at the bottom of its binade (kBf16Rounded). On the tensor-core path
// the attention output adds the probabilities P rounded to bf16 before P.V
// (the row sum l keeps the unrounded ones): each term P_j V_j moves by at most
// u P_j |V_j|, independently, so their sum moves by far less than u max|O|
// for the tested shapes (kBf16PRounding allows u). A resumed output is
// stored once after its first pass too. Everything kept in fp32 (LSE,
// dQ/dK/dV, the GEMM's fp32 output) is computed in fp32 from the same bf16
// inputs and keeps the fp32 tolerance, 1e-5.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "harness.hpp"

namespace gpu_test {

std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

int& failures() {
  static int n = 0;
  return n;
}

void expect(bool cond, const std::string& what) {
  if (cond) return;
  ++failures();
  std::printf("    FAILED: %s\n", what.c_str());
}

double check_close(const std::string& what, const std::vector<float>& got,
                   const std::vector<float>& want, double tol) {
  if (got.size() != want.size()) {
    expect(false,
           what + ": size " + std::to_string(got.size()) + " != " + std::to_string(want.size()));
    return INFINITY;
  }
  double max_diff = 0.0, max_ref = 0.0;
  size_t worst = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(want[i])) ++bad;
    // Equal values (also equal infinities: the -inf LSE of a masked row)
    // differ by 0, not by inf - inf.
    const double d = got[i] == want[i] ? 0.0 : std::fabs(double(got[i]) - double(want[i]));
    if (std::isfinite(want[i])) max_ref = std::max(max_ref, std::fabs(double(want[i])));
    if (d > max_diff || std::isnan(d)) {
      max_diff = std::isnan(d) ? INFINITY : d;
      worst = i;
    }
  }
  const double rel = max_ref > 0.0 ? max_diff / max_ref : max_diff;
  char line[256];
  std::snprintf(line, sizeof line, "%s: rel %.2e (tol %.0e, n %zu, worst [%zu] %g vs %g)",
                what.c_str(), rel, tol, got.size(), worst, got.empty() ? 0.0 : got[worst],
                want.empty() ? 0.0 : want[worst]);
  std::printf("    %s\n", line);
  expect(bad == 0, what + ": " + std::to_string(bad) + " non-finite values");
  expect(rel <= tol, line);
  return rel;
}

double check_increment(const std::string& what, const std::vector<float>& got,
                       const std::vector<float>& want, const std::vector<float>& base, double tol) {
  if (got.size() != want.size() || want.size() != base.size()) {
    expect(false, what + ": sizes " + std::to_string(got.size()) + ", " +
                      std::to_string(want.size()) + ", " + std::to_string(base.size()));
    return INFINITY;
  }
  double max_diff = 0.0, max_inc = 0.0, max_total = 0.0;
  size_t worst = 0, bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(want[i])) ++bad;
    const double inc_got = double(got[i]) - double(base[i]);
    const double inc_want = double(want[i]) - double(base[i]);
    const double d = std::fabs(inc_got - inc_want);
    max_inc = std::max(max_inc, std::fabs(inc_want));
    max_total = std::max({max_total, std::fabs(double(got[i])), std::fabs(double(want[i]))});
    if (d > max_diff || std::isnan(d)) {
      max_diff = std::isnan(d) ? INFINITY : d;
      worst = i;
    }
  }
  const double rounding = 2.0 * std::ldexp(max_total, -24);  // the final add, on each side
  const double rel = max_inc > 0.0 ? max_diff / max_inc : max_diff;
  const double allowed = tol * max_inc + rounding;
  char line[320];
  std::snprintf(line, sizeof line,
                "%s: increment rel %.2e (tol %.0e + rounding %.1e of %.2e, n %zu, worst [%zu] "
                "%g vs %g)",
                what.c_str(), rel, tol, rounding, max_inc, got.size(), worst,
                got.empty() ? 0.0 : got[worst] - base[worst],
                want.empty() ? 0.0 : want[worst] - base[worst]);
  std::printf("    %s\n", line);
  expect(bad == 0, what + ": " + std::to_string(bad) + " non-finite values");
  expect(max_inc > 0.0, what + ": the reference increment is zero everywhere");
  expect(max_diff <= allowed, line);
  return rel;
}

std::vector<cuda::Bf16> to_bits(const std::vector<float>& x) {
  std::vector<cuda::Bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
    out[i].bits = uint16_t(u >> 16);
  }
  return out;
}

std::vector<float> from_bits(const std::vector<cuda::Bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t u = uint32_t(x[i].bits) << 16;
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

std::vector<float> round_bf16(const std::vector<float>& x) { return from_bits(to_bits(x)); }

}  // namespace gpu_test
