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
//   2  blas-tiles the kernel before gemm_direct (3413f59, dated note
//                 share/trident/benchmarks/cpu-2026-12-02-attention.md),
//                 simplified: 256 x 512 tiles whose GEMMs are OpenBLAS calls,
//                 softmax and dS as scalar row passes (3413f59 also cut the
//                 diagonal tiles in 32-row bands and had an AVX exp); no
//                 documents or window
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
#include "trident/kernels/gemm.hpp"

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

// ---- Variant 2: OpenBLAS tiles, the structure of the kernel before
// gemm_direct (3413f59; share/trident/benchmarks/cpu-2026-12-02-attention.md)
// without its diagonal row bands and vector exp: flash attention over
// 256-query by 512-key tiles whose GEMMs are kernels::sgemm calls (OpenBLAS
// packs both operands of each), the online softmax and the backward's
// P = exp(S - lse), dS = P (dP - delta) as scalar row passes. No documents
// or window (the harness's shapes have none).
constexpr int64_t kBq = 256, kBk = 512;

// One head's view: its rows in q/out/dout ([T, H, D]) and in k/v ([T, Hkv, D]).
struct HeadView {
  int64_t q_off, kv_off, q_ld, kv_ld;
};

HeadView head_view(const AttnShape& s, int h) {
  const int g = h / (s.H / s.Hkv);
  return {int64_t(h) * s.D, int64_t(g) * s.D, int64_t(s.H) * s.D, int64_t(s.Hkv) * s.D};
}

// S = scale Q_blk K_blkᵀ with the pairs the mask hides at -inf; returns
// whether any pair of the tile is visible.
bool scores(const AttnShape& s, const Buffers& b, const HeadView& hv, int64_t i0, int64_t bq,
            int64_t j0, int64_t bk, float* S) {
  if (s.causal && j0 > i0 + bq - 1) return false;
  kernels::sgemm(test::kernel_ctx(), false, true, bq, bk, s.D, s.scale,
                 b.q.data() + i0 * hv.q_ld + hv.q_off, hv.q_ld,
                 b.k.data() + j0 * hv.kv_ld + hv.kv_off, hv.kv_ld, 0.0f, S, bk);
  for (int64_t i = 0; i < bq; ++i)
    for (int64_t j = 0; j < bk; ++j)
      if (!kernels::attn_pair_visible(s, i0 + i, j0 + j, 0, 0)) S[i * bk + j] = -INFINITY;
  return true;
}

// The online softmax of one tile's rows: m, l and the O rows rescaled, P = exp(S - m).
void online_softmax(int64_t bq, int64_t bk, int D, float* S, float* m, float* l, float* O) {
  for (int64_t i = 0; i < bq; ++i) {
    float* row = S + i * bk;
    const float mx = std::max(m[i], *std::max_element(row, row + bk));
    if (mx == -INFINITY) continue;  // nothing visible yet
    const float c = std::exp(m[i] - mx);
    float sum = 0.0f;
    for (int64_t j = 0; j < bk; ++j) sum += (row[j] = std::exp(row[j] - mx));
    l[i] = l[i] * c + sum;
    m[i] = mx;
    for (int d = 0; d < D; ++d) O[i * D + d] *= c;
  }
}

void blas_forward_head(const AttnShape& s, Buffers& b, int h) {
  const HeadView hv = head_view(s, h);
  std::vector<float> S(size_t(kBq * kBk)), O(size_t(kBq * s.D));
  for (int64_t i0 = 0; i0 < s.Tq; i0 += kBq) {
    const int64_t bq = std::min(kBq, s.Tq - i0);
    std::vector<float> m(size_t(bq), -INFINITY), l(size_t(bq), 0.0f);
    std::fill(O.begin(), O.end(), 0.0f);
    for (int64_t j0 = 0; j0 < s.Tk; j0 += kBk) {
      const int64_t bk = std::min(kBk, s.Tk - j0);
      if (!scores(s, b, hv, i0, bq, j0, bk, S.data())) continue;
      online_softmax(bq, bk, s.D, S.data(), m.data(), l.data(), O.data());
      for (int64_t i = 0; i < bq; ++i)  // rows that saw nothing yet hold -inf: no weight
        if (m[size_t(i)] == -INFINITY) std::fill_n(S.data() + i * bk, bk, 0.0f);
      kernels::sgemm(test::kernel_ctx(), false, false, bq, s.D, bk, 1.0f, S.data(), bk,
                     b.v.data() + j0 * hv.kv_ld + hv.kv_off, hv.kv_ld, 1.0f, O.data(), s.D);
    }
    for (int64_t i = 0; i < bq; ++i) {
      const float li = l[size_t(i)];
      float* out = b.out.data() + (i0 + i) * hv.q_ld + hv.q_off;
      for (int d = 0; d < s.D; ++d) out[d] = li > 0.0f ? O[size_t(i * s.D + d)] / li : 0.0f;
      b.lse[size_t((i0 + i) * s.H + h)] = li > 0.0f ? m[size_t(i)] + std::log(li) : -INFINITY;
    }
  }
}

void blas_forward(const AttnShape& s, Buffers& b) {
  for (int h = 0; h < s.H; ++h) blas_forward_head(s, b, h);
}

// One tile of the backward: P from the forward's lse, dV += Pᵀ dO, dP = dO Vᵀ,
// dS = P (dP - delta), dQ += scale dS K, dK += scale dSᵀ Q.
void blas_backward_tile(const AttnShape& s, Buffers& b, int h, int64_t i0, int64_t bq, int64_t j0,
                        int64_t bk, const std::vector<float>& delta, float* S, float* dP) {
  const HeadView hv = head_view(s, h);
  if (!scores(s, b, hv, i0, bq, j0, bk, S)) return;
  for (int64_t i = 0; i < bq; ++i) {
    const float lse = b.lse[size_t((i0 + i) * s.H + h)];
    for (int64_t j = 0; j < bk; ++j)
      S[i * bk + j] = lse == -INFINITY ? 0.0f : std::exp(S[i * bk + j] - lse);
  }
  const auto& ctx = test::kernel_ctx();
  const float *Q = b.q.data() + i0 * hv.q_ld + hv.q_off,
              *dO = b.dout.data() + i0 * hv.q_ld + hv.q_off;
  const float *K = b.k.data() + j0 * hv.kv_ld + hv.kv_off,
              *V = b.v.data() + j0 * hv.kv_ld + hv.kv_off;
  kernels::sgemm(ctx, true, false, bk, s.D, bq, 1.0f, S, bk, dO, hv.q_ld, 1.0f,
                 b.dv.data() + j0 * hv.kv_ld + hv.kv_off, hv.kv_ld);
  kernels::sgemm(ctx, false, true, bq, bk, s.D, 1.0f, dO, hv.q_ld, V, hv.kv_ld, 0.0f, dP, bk);
  for (int64_t i = 0; i < bq; ++i)
    for (int64_t j = 0; j < bk; ++j)
      dP[i * bk + j] = S[i * bk + j] * (dP[i * bk + j] - delta[size_t(i0 + i)]);
  kernels::sgemm(ctx, false, false, bq, s.D, bk, s.scale, dP, bk, K, hv.kv_ld, 1.0f,
                 b.dq.data() + i0 * hv.q_ld + hv.q_off, hv.q_ld);
  kernels::sgemm(ctx, true, false, bk, s.D, bq, s.scale, dP, bk, Q, hv.q_ld, 1.0f,
                 b.dk.data() + j0 * hv.kv_ld + hv.kv_off, hv.kv_ld);
}

void blas_backward(const AttnShape& s, Buffers& b) {
  std::vector<float> S(size_t(kBq * kBk)), dP(size_t(kBq * kBk)), delta(size_t(s.Tq));
  for (int h = 0; h < s.H; ++h) {
    const HeadView hv = head_view(s, h);
    for (int64_t t = 0; t < s.Tq; ++t) {  // delta = rowsum(dO * O)
      double acc = 0.0;
      for (int d = 0; d < s.D; ++d)
        acc += double(b.dout[size_t(t * hv.q_ld + hv.q_off + d)]) *
               b.out[size_t(t * hv.q_ld + hv.q_off + d)];
      delta[size_t(t)] = float(acc);
    }
    for (int64_t i0 = 0; i0 < s.Tq; i0 += kBq)
      for (int64_t j0 = 0; j0 < s.Tk; j0 += kBk)
        blas_backward_tile(s, b, h, i0, std::min(kBq, s.Tq - i0), j0, std::min(kBk, s.Tk - j0),
                           delta, S.data(), dP.data());
  }
}

constexpr Variant kVariants[] = {
    {0, "reference", reference_forward, reference_backward},
    {1, "tuned", tuned_forward, tuned_backward},
    {2, "blas-tiles", blas_forward, blas_backward},
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
  kernels::set_blas_threads(1);  // one core, as a training rank runs (variant 2's GEMMs)
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
