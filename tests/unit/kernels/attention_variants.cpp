// The dev harness of the CPU attention (llm.c's dev/cuda): numbered variants
// of the forward and backward, each first validated against the plain
// reference (kernels/cpu/reference.hpp: relative L2 error of out, lse, dq,
// dk, dv within --tol), then timed (median of --reps calls). A variant that
// was tried stays here, runnable, instead of living in a dated note; the
// default path is variant 1.
//
//   attention_variants [--variant N] [--T 1024] [--H 8] [--Hkv 8] [--D 64]
//                      [--causal 0|1] [--reps 5] [--tol 1e-5] [--validate-only]
//
// Prints one line per variant: its number and name, forward and backward
// milliseconds and GFLOP/s, the largest relative error; exits 1 when a
// variant fails its validation, 2 on a bad argument.
//
// Variants (a new one is a row of kVariants):
//   0  reference  the plain fp64 definition (attention_reference.cpp)
//   1  tuned      kernels/cpu/attention.cpp: tiles, gemm_direct, the softmax
//                 and dS fused into the GEMM tiles where gemm_direct is native
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_ctx.hpp"
#include "reference.hpp"
#include "trident/core/clock.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/attention.hpp"

using namespace trident;
using kernels::AttnShape;

namespace {

struct Buffers {
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
};

struct Variant {
  int number;
  const char* name;
  void (*forward)(const AttnShape&, Buffers&);
  void (*backward)(const AttnShape&, Buffers&);
};

void reference_forward(const AttnShape& s, Buffers& b) {
  kernels::cpu::reference::attention_forward(s, b.q.data(), b.k.data(), b.v.data(), b.out.data(),
                                             b.lse.data());
}
void reference_backward(const AttnShape& s, Buffers& b) {
  kernels::cpu::reference::attention_backward(s, b.q.data(), b.k.data(), b.v.data(), b.dout.data(),
                                              b.dq.data(), b.dk.data(), b.dv.data());
}
void tuned_forward(const AttnShape& s, Buffers& b) {
  kernels::attention_forward(test::kernel_ctx(), s, b.q.data(), b.k.data(), b.v.data(),
                             b.out.data(), b.lse.data());
}
void tuned_backward(const AttnShape& s, Buffers& b) {
  kernels::attention_backward(test::kernel_ctx(), s, b.q.data(), b.k.data(), b.v.data(),
                              b.out.data(), b.lse.data(), b.dout.data(), b.dq.data(), b.dk.data(),
                              b.dv.data());
}

constexpr Variant kVariants[] = {
    {0, "reference", reference_forward, reference_backward},
    {1, "tuned", tuned_forward, tuned_backward},
};

struct Options {
  int variant = -1;  // all
  int64_t T = 1024;
  int H = 8, Hkv = 8, D = 64;
  bool causal = true, validate_only = false;
  int reps = 5;
  double tol = 1e-5;
};

[[noreturn]] void bad_argument(const std::string& what) {
  std::fprintf(stderr, "attention_variants: %s\n", what.c_str());
  std::exit(2);
}

// Sets option a to v; false when there is no such option.
bool set_option(Options& o, const std::string& a, const char* v) {
  if (a == "--variant")
    o.variant = std::atoi(v);
  else if (a == "--T")
    o.T = std::atoll(v);
  else if (a == "--H")
    o.H = std::atoi(v);
  else if (a == "--Hkv")
    o.Hkv = std::atoi(v);
  else if (a == "--D")
    o.D = std::atoi(v);
  else if (a == "--causal")
    o.causal = std::atoi(v) != 0;
  else if (a == "--reps")
    o.reps = std::max(1, std::atoi(v));
  else if (a == "--tol")
    o.tol = std::atof(v);
  else
    return false;
  return true;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--validate-only") {
      o.validate_only = true;
      continue;
    }
    if (i + 1 >= argc) bad_argument(a + " needs a value");
    if (!set_option(o, a, argv[++i])) bad_argument("unknown option " + a);
  }
  if (o.T <= 0 || o.H <= 0 || o.Hkv <= 0 || o.D <= 0 || o.H % o.Hkv != 0)
    bad_argument("T, H, Hkv, D must be positive and H a multiple of Hkv");
  return o;
}

Buffers make_buffers(const AttnShape& s) {
  const auto nq = size_t(s.Tq * s.H * s.D), nk = size_t(s.Tk * s.Hkv * s.D);
  Buffers b{std::vector<float>(nq), std::vector<float>(nk), std::vector<float>(nk),
            std::vector<float>(nq), std::vector<float>(nq), std::vector<float>(size_t(s.Tq * s.H)),
            std::vector<float>(nq), std::vector<float>(nk), std::vector<float>(nk)};
  rng::fill_normal(b.q.data(), int64_t(nq), rng::hash_name("q"), 0, 1.0f);
  rng::fill_normal(b.k.data(), int64_t(nk), rng::hash_name("k"), 0, 1.0f);
  rng::fill_normal(b.v.data(), int64_t(nk), rng::hash_name("v"), 0, 1.0f);
  rng::fill_normal(b.dout.data(), int64_t(nq), rng::hash_name("dout"), 0, 1.0f);
  return b;
}

// Runs the forward, then the backward from zero gradients.
void run(const Variant& v, const AttnShape& s, Buffers& b) {
  v.forward(s, b);
  std::fill(b.dq.begin(), b.dq.end(), 0.0f);
  std::fill(b.dk.begin(), b.dk.end(), 0.0f);
  std::fill(b.dv.begin(), b.dv.end(), 0.0f);
  v.backward(s, b);
}

// Relative L2 error of got against want over the finite elements of want.
double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(want[i])) continue;
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

double max_error(const Buffers& got, const Buffers& want) {
  return std::max({rel_l2(got.out, want.out), rel_l2(got.lse, want.lse), rel_l2(got.dq, want.dq),
                   rel_l2(got.dk, want.dk), rel_l2(got.dv, want.dv)});
}

// Median seconds of reps calls of f.
template <class F>
double median_s(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = monotonic_s();
    f();
    t.push_back(monotonic_s() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  AttnShape s;
  s.Tq = s.Tk = o.T, s.H = o.H, s.Hkv = o.Hkv, s.D = o.D, s.causal = o.causal;
  s.scale = 1.0f / std::sqrt(float(o.D));
  Buffers want = make_buffers(s);
  run(kVariants[0], s, want);
  std::printf("attention T=%lld H=%d Hkv=%d D=%d causal=%d, validated against variant 0\n",
              (long long)o.T, o.H, o.Hkv, o.D, int(o.causal));
  std::printf("%3s %-10s %10s %10s %9s %9s %10s\n", "#", "variant", "fwd ms", "bwd ms", "fwd GF/s",
              "bwd GF/s", "rel err");
  int failed = 0;
  for (const Variant& v : kVariants) {
    if (o.variant >= 0 && v.number != o.variant) continue;
    Buffers b = make_buffers(s);
    run(v, s, b);
    const double err = max_error(b, want);
    const bool ok = err <= o.tol;
    failed += !ok;
    double fwd = NAN, bwd = NAN;
    if (ok && !o.validate_only) {
      fwd = median_s(o.reps, [&] { v.forward(s, b); });
      bwd = median_s(o.reps, [&] { v.backward(s, b); });
    }
    std::printf("%3d %-10s %10.2f %10.2f %9.1f %9.1f %10.2e%s\n", v.number, v.name, fwd * 1e3,
                bwd * 1e3, kernels::attention_flops(s, false) / fwd * 1e-9,
                kernels::attention_flops(s, true) / bwd * 1e-9, err, ok ? "" : "  WRONG");
  }
  return failed ? 1 : 0;
}
