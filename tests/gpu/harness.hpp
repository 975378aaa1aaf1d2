// A small test harness for the GPU tests (the GPU machine has no Catch2):
// GPU_TEST registers a case, check_close compares a device result with the
// CPU reference, and main() runs the cases or reports SKIP (exit 77, ctest's
// SKIP_RETURN_CODE) with the reason when no CUDA device is visible.
//
// Tolerance: the largest absolute difference divided by the largest absolute
// reference value (a norm-wise relative error, which does not blow up on
// elements near zero), plus a NaN/Inf check on every element. The checks
// are host code (harness_checks.cpp), so the CPU test of the bounds uses them too.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "random.hpp"
#include "trident/kernels/cuda/ops.hpp"
#include "trident/kernels/cuda/runtime.hpp"

namespace gpu_test {

namespace cuda = trident::kernels::cuda;
using trident::kernels::Ctx;

struct Case {
  const char* name;
  std::function<void(cuda::StreamContext&)> fn;
};
std::vector<Case>& registry();
struct Register {
  Register(const char* name, std::function<void(cuda::StreamContext&)> fn) {
    registry().push_back({name, std::move(fn)});
  }
};
#define GPU_TEST_CAT2(a, b) a##b
#define GPU_TEST_CAT(a, b) GPU_TEST_CAT2(a, b)
#define GPU_TEST(name)                                                                           \
  static void GPU_TEST_CAT(gpu_case_, __LINE__)(gpu_test::cuda::StreamContext&);                 \
  static gpu_test::Register GPU_TEST_CAT(gpu_reg_, __LINE__)(name,                               \
                                                             GPU_TEST_CAT(gpu_case_, __LINE__)); \
  static void GPU_TEST_CAT(gpu_case_, __LINE__)(gpu_test::cuda::StreamContext & dc)

// Failures of the running case (printed as they happen).
int& failures();

// Records a failure unless cond holds.
void expect(bool cond, const std::string& what);

// Norm-wise relative error of got against want; records a failure above tol.
double check_close(const std::string& what, const std::vector<float>& got,
                   const std::vector<float>& want, double tol);

// For an op that accumulates onto `base` (gradients): compares the
// increments got - base and want - base instead of the totals, whose N(0,1)
// starting values would hide an error in a small increment. Relative to the
// largest increment, within tol plus one fp32 rounding of each total
// (2^-24 of its magnitude: the final add on either side); records a failure
// above that, or when the increment is zero everywhere (nothing to check).
double check_increment(const std::string& what, const std::vector<float>& got,
                       const std::vector<float>& want, const std::vector<float>& base, double tol);

// Tolerances of bf16 results against the fp32 CPU reference run on the same
// bf16-rounded inputs (harness_checks.cpp derives each bound;
// test_bf16_bounds checks them on the CPU with the tests' own inputs).
// bf16 keeps 8 significant bits: its unit roundoff is u = 2^-8, the most
// that rounding to nearest even moves a value, relative to it.
constexpr double kBf16Unit = 1.0 / 256;
// A result stored in bf16 once, against an fp32 reference (GEMM output,
// AdamW's bf16 copy).
constexpr double kBf16Stored = kBf16Unit;
// Two results rounded to bf16 independently (the GPU's and the CPU's staged
// output): values a hair apart round to neighbours, one whole unit in the
// last place apart, 2u of the largest value.
constexpr double kBf16Rounded = 2 * kBf16Unit;
// The tensor cores' share of the attention output: P rounded to bf16 before
// P.V, each term moved by at most u of itself, independently.
constexpr double kBf16PRounding = kBf16Unit;
// The bf16 attention output against the fp32 reference: its storage plus P.
constexpr double kBf16Attention = kBf16Stored + kBf16PRounding;
// ... against the CPU's staged bf16 output (itself rounded): two roundings plus P.
constexpr double kBf16AttentionRounded = kBf16Rounded + kBf16PRounding;
// Ring attention's resumed output against the one-pass output (both on the
// device): the final storage of each (2u), the resumed one's storage after
// its first pass (u), and P in each (2u).
constexpr double kBf16Resumed = kBf16Rounded + kBf16Stored + 2 * kBf16PRounding;

// Deterministic random data: normal(0, scale) keyed by name, the counter
// RNG's draws that the other tests take (tests/support/random.hpp).
using trident::testing::randn;

// Rounds to bf16 and back (what the GPU sees of a bf16 input).
std::vector<float> round_bf16(const std::vector<float>& x);
std::vector<cuda::Bf16> to_bits(const std::vector<float>& x);
std::vector<float> from_bits(const std::vector<cuda::Bf16>& x);

// A device array of T on the context's allocator, freed on scope exit.
template <class T>
class Buf {
 public:
  Buf(cuda::StreamContext& dc, size_t n) : dc_(&dc), n_(n) {
    p_ = static_cast<T*>(dc.allocator().allocate(n * sizeof(T)));
    cuda::fill_zero(dc.ctx(), p_, n * sizeof(T));
  }
  Buf(cuda::StreamContext& dc, const std::vector<T>& host) : Buf(dc, host.size()) {
    cuda::copy_to_device(dc.ctx(), p_, host.data(), host.size() * sizeof(T));
  }
  ~Buf() { dc_->allocator().deallocate(p_, n_ * sizeof(T)); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  T* get() const { return p_; }
  operator T*() const { return p_; }
  size_t size() const { return n_; }
  std::vector<T> host() const {
    std::vector<T> out(n_);
    cuda::copy_to_host(dc_->ctx(), out.data(), p_, n_ * sizeof(T), 120.0);
    return out;
  }

 private:
  cuda::StreamContext* dc_;
  size_t n_;
  T* p_ = nullptr;
};

}  // namespace gpu_test
