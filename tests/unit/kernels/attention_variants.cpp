// The dev harness of the CPU attention (llm.c's dev/cuda): numbered variants
// of the forward and backward, each first validated against the plain
// reference (kernels/cpu/reference.hpp: relative L2 error of out, lse, dq,
// dk, dv within --tol), then timed (median of --reps calls by the thread's
// CPU time, on one BLAS thread). A variant that was tried stays here,
// runnable, instead of living in a dated note; the default path is variant 1.
//
//   attention_variants [--variant N] [--T 1024] [--H 8] [--Hkv 8] [--D 64]
//                      [--causal 0|1] [--reps 5] [--tol 1e-5] [--validate-only]
//
// Prints one line per variant: its number and name, forward and backward
// CPU milliseconds and GFLOP/s, the largest relative error; exits 1 when a
// variant fails its validation, 2 on a bad argument.
//
// Variants (a new one is a row of kVariants). 2-6 are the tiled kernels
// the dated notes in share/trident/benchmarks measured and main dropped, in
// plain form (scalar exp and row passes, no documents or window; see
// "Variants 2-6" below and share/trident/cpu-kernels.md):
//   0  reference       the plain fp64 definition (attention_reference.cpp)
//   1  tuned           kernels/cpu/attention.cpp: tiles, gemm_direct, the
//                      softmax and dS fused into the GEMM tiles where
//                      gemm_direct is native
//   2  blas-tiles      256 x 512 tiles, OpenBLAS GEMMs, no bands
//                      (cpu-2026-12-02-attention.md's old binary, 3413f59,
//                      without its bands)
//   3  blas-128x256    128 x 256 tiles, OpenBLAS, no bands (87e64bd,
//                      cpu-2026-12-01-attention.md's old binary)
//   4  blas-bands      256 x 512 tiles cut in 32-row bands on the diagonal,
//                      OpenBLAS (103a4ca, that note's new binary)
//   5  direct-tiles    4 with gemm_direct reading Kᵀ and Vᵀ by rows
//                      (c115576, cpu-2026-12-02-attention.md's and
//                      cpu-2026-12-02-direct.md's new binary)
//   6  direct-256x256  5 with tiles of 256 keys (cpu-2026-12-02-direct.md:
//                      "tiles of 256 keys instead of 512", within the noise)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "gemm_direct.hpp"
#include "kernel_ctx.hpp"
#include "reference.hpp"
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

// ---- Variants 2-6: the tiled kernels that came before the tuned one, in
// plain form: flash attention over bq-query by bk-key tiles, the online
// softmax and the backward's P = exp(S - lse), dS = P (dP - delta) as scalar
// row passes. A Tiling says what each had:
//   bq x bk  the tile (256 x 512 since 103a4ca, 128 x 256 before);
//   bands    tiles the causal diagonal crosses cut into bands of 32 query
//            rows, each only as wide as its last row sees (103a4ca; the
//            kernel shared the columns every band sees in one GEMM, here
//            each band has its own);
//   direct   GEMMs by gemm_direct (kernels/cpu/gemm_direct.hpp), K and V
//            transposed once per kv head into Kᵀ and Vᵀ by rows (c115576;
//            the panels and the fused row passes came after), else OpenBLAS
//            (kernels::sgemm packs both operands of every call).
// No documents or window (the harness's shapes have none).
struct Tiling {
  int64_t bq, bk;
  bool bands, direct;
};
constexpr int64_t kBand = 32;

// One head: its rows in q/out/dout ([T, H, D]) and in k/v ([T, Hkv, D]),
// and with direct its kv head's Kᵀ and Vᵀ ([D, Tk] at row stride Tk).
struct HeadView {
  int64_t q_off, kv_off, q_ld, kv_ld;
  const float *kt = nullptr, *vt = nullptr;
};

HeadView head_view(const AttnShape& s, int h) {
  const int g = h / (s.H / s.Hkv);
  return {int64_t(h) * s.D, int64_t(g) * s.D, int64_t(s.H) * s.D, int64_t(s.Hkv) * s.D};
}

// Kᵀ and Vᵀ of every kv head, [Hkv][D, Tk] (empty unless direct).
struct Transposed {
  std::vector<float> kt, vt;
  Transposed(const AttnShape& s, const Buffers& b, bool direct) {
    if (!direct) return;
    const int64_t n = int64_t(s.D) * s.Tk, ld = int64_t(s.Hkv) * s.D;
    kt.resize(size_t(s.Hkv * n));
    vt.resize(kt.size());
    for (int g = 0; g < s.Hkv; ++g) {
      kernels::cpu::transpose_rows(b.k.data() + g * s.D, ld, s.Tk, s.D, kt.data() + g * n, s.Tk);
      kernels::cpu::transpose_rows(b.v.data() + g * s.D, ld, s.Tk, s.D, vt.data() + g * n, s.Tk);
    }
  }
  HeadView view(const AttnShape& s, int h) const {
    HeadView hv = head_view(s, h);
    if (kt.empty()) return hv;
    const int64_t n = int64_t(s.D) * s.Tk, g = h / (s.H / s.Hkv);
    hv.kt = kt.data() + g * n;
    hv.vt = vt.data() + g * n;
    return hv;
  }
};

// C = alpha op(A) B + beta C, row-major, A transposed when ta.
void gemm(const Tiling& t, bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (t.direct)
    kernels::cpu::gemm_direct(test::kernel_ctx(), ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    kernels::sgemm(test::kernel_ctx(), ta, false, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// C [M, N] = alpha A Xᵀ for X [N, K] at row stride ldx (Q Kᵀ, dO Vᵀ): OpenBLAS
// reads X transposed, gemm_direct xt = Xᵀ [K, N] at row stride ldt.
void gemm_xt(const Tiling& t, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
             int64_t lda, const float* X, int64_t ldx, const float* xt, int64_t ldt, float* C) {
  if (t.direct)
    kernels::cpu::gemm_direct(test::kernel_ctx(), false, M, N, K, alpha, A, lda, xt, ldt, 0.0f, C,
                              N);
  else
    kernels::sgemm(test::kernel_ctx(), false, true, M, N, K, alpha, A, lda, X, ldx, 0.0f, C, N);
}

// A piece of a tile: query rows [r0, r0 + rows) of the tile against its
// first w keys.
struct Piece {
  int64_t r0, rows, w;
};

// The pieces of tile (i0, bq) x (j0, bk) that hold visible pairs: none above
// the causal diagonal, the whole tile, or with bands where the diagonal
// crosses it, each band of kBand rows up to its last row's own key.
std::vector<Piece> pieces(const AttnShape& s, const Tiling& t, int64_t i0, int64_t bq, int64_t j0,
                          int64_t bk) {
  if (s.causal && j0 > i0 + bq - 1) return {};
  if (!t.bands || !s.causal || j0 + bk - 1 <= i0) return {{0, bq, bk}};
  std::vector<Piece> out;
  for (int64_t r0 = 0; r0 < bq; r0 += kBand) {
    const int64_t rows = std::min(kBand, bq - r0), w = std::min(bk, i0 + r0 + rows - j0);
    if (w > 0) out.push_back({r0, rows, w});
  }
  return out;
}

// S [bq, bk] = scale Q_blk K_blkᵀ with the pairs the mask hides at -inf.
void scores(const AttnShape& s, const Tiling& t, const Buffers& b, const HeadView& hv, int64_t i0,
            int64_t bq, int64_t j0, int64_t bk, float* S) {
  gemm_xt(t, bq, bk, s.D, s.scale, b.q.data() + i0 * hv.q_ld + hv.q_off, hv.q_ld,
          b.k.data() + j0 * hv.kv_ld + hv.kv_off, hv.kv_ld, hv.kt + j0, s.Tk, S);
  for (int64_t i = 0; i < bq; ++i)
    for (int64_t j = 0; j < bk; ++j)
      if (!kernels::attn_pair_visible(s, i0 + i, j0 + j, 0, 0)) S[i * bk + j] = -INFINITY;
}

// The online softmax of one piece's rows: m, l and the O rows rescaled,
// P = exp(S - m) (0 in rows that saw nothing yet).
void online_softmax(int64_t bq, int64_t bk, int D, float* S, float* m, float* l, float* O) {
  for (int64_t i = 0; i < bq; ++i) {
    float* row = S + i * bk;
    const float mx = std::max(m[i], *std::max_element(row, row + bk));
    if (mx == -INFINITY) {  // nothing visible yet: no weight
      std::fill_n(row, bk, 0.0f);
      continue;
    }
    const float c = std::exp(m[i] - mx);
    float sum = 0.0f;
    for (int64_t j = 0; j < bk; ++j) sum += (row[j] = std::exp(row[j] - mx));
    l[i] = l[i] * c + sum;
    m[i] = mx;
    for (int d = 0; d < D; ++d) O[i * D + d] *= c;
  }
}

// The running softmax of one query block: row max m, sum l, unnormalised O.
struct BlockState {
  std::vector<float> S, m, l, O;
};

void forward_tile(const AttnShape& s, const Tiling& t, const Buffers& b, const HeadView& hv,
                  int64_t i0, int64_t bq, int64_t j0, int64_t bk, BlockState& st) {
  for (const Piece& p : pieces(s, t, i0, bq, j0, bk)) {
    float *m = st.m.data() + p.r0, *l = st.l.data() + p.r0, *O = st.O.data() + p.r0 * s.D;
    scores(s, t, b, hv, i0 + p.r0, p.rows, j0, p.w, st.S.data());
    online_softmax(p.rows, p.w, s.D, st.S.data(), m, l, O);
    gemm(t, false, p.rows, s.D, p.w, 1.0f, st.S.data(), p.w, b.v.data() + j0 * hv.kv_ld + hv.kv_off,
         hv.kv_ld, 1.0f, O, s.D);
  }
}

void tiled_forward_head(const AttnShape& s, const Tiling& t, Buffers& b, const HeadView& hv,
                        int h) {
  BlockState st{std::vector<float>(size_t(t.bq * t.bk)), {}, {}, {}};
  for (int64_t i0 = 0; i0 < s.Tq; i0 += t.bq) {
    const int64_t bq = std::min(t.bq, s.Tq - i0);
    st.m.assign(size_t(bq), -INFINITY);
    st.l.assign(size_t(bq), 0.0f);
    st.O.assign(size_t(bq * s.D), 0.0f);
    for (int64_t j0 = 0; j0 < s.Tk; j0 += t.bk)
      forward_tile(s, t, b, hv, i0, bq, j0, std::min(t.bk, s.Tk - j0), st);
    for (int64_t i = 0; i < bq; ++i) {
      const float li = st.l[size_t(i)];
      float* out = b.out.data() + (i0 + i) * hv.q_ld + hv.q_off;
      for (int d = 0; d < s.D; ++d) out[d] = li > 0.0f ? st.O[size_t(i * s.D + d)] / li : 0.0f;
      b.lse[size_t((i0 + i) * s.H + h)] = li > 0.0f ? st.m[size_t(i)] + std::log(li) : -INFINITY;
    }
  }
}

template <Tiling T>
void tiled_forward(const AttnShape& s, Buffers& b) {
  const Transposed kv(s, b, T.direct);
  for (int h = 0; h < s.H; ++h) tiled_forward_head(s, T, b, kv.view(s, h), h);
}

// One piece of the backward: P from the forward's lse, dV += Pᵀ dO,
// dP = dO Vᵀ, dS = P (dP - delta), dQ += scale dS K, dK += scale dSᵀ Q.
void backward_piece(const AttnShape& s, const Tiling& t, Buffers& b, const HeadView& hv, int h,
                    int64_t i0, int64_t bq, int64_t j0, int64_t bk, const std::vector<float>& delta,
                    float* S, float* dP) {
  scores(s, t, b, hv, i0, bq, j0, bk, S);
  for (int64_t i = 0; i < bq; ++i) {
    const float lse = b.lse[size_t((i0 + i) * s.H + h)];
    for (int64_t j = 0; j < bk; ++j)
      S[i * bk + j] = lse == -INFINITY ? 0.0f : std::exp(S[i * bk + j] - lse);
  }
  const float *Q = b.q.data() + i0 * hv.q_ld + hv.q_off,
              *dO = b.dout.data() + i0 * hv.q_ld + hv.q_off;
  const float *K = b.k.data() + j0 * hv.kv_ld + hv.kv_off,
              *V = b.v.data() + j0 * hv.kv_ld + hv.kv_off;
  gemm(t, true, bk, s.D, bq, 1.0f, S, bk, dO, hv.q_ld, 1.0f,
       b.dv.data() + j0 * hv.kv_ld + hv.kv_off, hv.kv_ld);
  gemm_xt(t, bq, bk, s.D, 1.0f, dO, hv.q_ld, V, hv.kv_ld, hv.vt + j0, s.Tk, dP);
  for (int64_t i = 0; i < bq; ++i)
    for (int64_t j = 0; j < bk; ++j)
      dP[i * bk + j] = S[i * bk + j] * (dP[i * bk + j] - delta[size_t(i0 + i)]);
  gemm(t, false, bq, s.D, bk, s.scale, dP, bk, K, hv.kv_ld, 1.0f,
       b.dq.data() + i0 * hv.q_ld + hv.q_off, hv.q_ld);
  gemm(t, true, bk, s.D, bq, s.scale, dP, bk, Q, hv.q_ld, 1.0f,
       b.dk.data() + j0 * hv.kv_ld + hv.kv_off, hv.kv_ld);
}

// delta[t] = rowsum(dO * O) of one head, in double.
void head_delta(const AttnShape& s, const Buffers& b, const HeadView& hv,
                std::vector<float>& delta) {
  for (int64_t t = 0; t < s.Tq; ++t) {
    double acc = 0.0;
    for (int d = 0; d < s.D; ++d)
      acc += double(b.dout[size_t(t * hv.q_ld + hv.q_off + d)]) *
             b.out[size_t(t * hv.q_ld + hv.q_off + d)];
    delta[size_t(t)] = float(acc);
  }
}

template <Tiling T>
void tiled_backward(const AttnShape& s, Buffers& b) {
  const Transposed kv(s, b, T.direct);
  std::vector<float> S(size_t(T.bq * T.bk)), dP(S.size()), delta(size_t(s.Tq));
  for (int h = 0; h < s.H; ++h) {
    const HeadView hv = kv.view(s, h);
    head_delta(s, b, hv, delta);
    for (int64_t i0 = 0; i0 < s.Tq; i0 += T.bq) {
      const int64_t bq = std::min(T.bq, s.Tq - i0);
      for (int64_t j0 = 0; j0 < s.Tk; j0 += T.bk) {
        const int64_t bk = std::min(T.bk, s.Tk - j0);
        for (const Piece& p : pieces(s, T, i0, bq, j0, bk))
          backward_piece(s, T, b, hv, h, i0 + p.r0, p.rows, j0, p.w, delta, S.data(), dP.data());
      }
    }
  }
}

constexpr Tiling kBlasTiles{256, 512, false, false}, kBlas128{128, 256, false, false};
constexpr Tiling kBlasBands{256, 512, true, false}, kDirect{256, 512, true, true};
constexpr Tiling kDirect256{256, 256, true, true};

constexpr Variant kVariants[] = {
    {0, "reference", reference_forward, reference_backward},
    {1, "tuned", tuned_forward, tuned_backward},
    {2, "blas-tiles", tiled_forward<kBlasTiles>, tiled_backward<kBlasTiles>},
    {3, "blas-128x256", tiled_forward<kBlas128>, tiled_backward<kBlas128>},
    {4, "blas-bands", tiled_forward<kBlasBands>, tiled_backward<kBlasBands>},
    {5, "direct-tiles", tiled_forward<kDirect>, tiled_backward<kDirect>},
    {6, "direct-256x256", tiled_forward<kDirect256>, tiled_backward<kDirect256>},
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

// This thread's CPU time in seconds: on a machine shared with other
// processes it counts the variant's own work, where the wall clock counts
// the others' time slices too.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Median CPU seconds of reps calls of f.
template <class F>
double median_s(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_cpu_s();
    f();
    t.push_back(thread_cpu_s() - t0);
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
  std::printf("%3s %-14s %10s %10s %9s %9s %10s\n", "#", "variant", "fwd ms", "bwd ms", "fwd GF/s",
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
    std::printf("%3d %-14s %10.2f %10.2f %9.1f %9.1f %10.2e%s\n", v.number, v.name, fwd * 1e3,
                bwd * 1e3, kernels::attention_flops(s, false) / fwd * 1e-9,
                kernels::attention_flops(s, true) / bwd * 1e-9, err, ok ? "" : "  WRONG");
  }
  return failed ? 1 : 0;
}
