// CPU flash-style attention, forward and backward (see kernels/attention.hpp):
// the tuned kernel. Its plain definition stands beside it
// (attention_reference.cpp), which test_attention_kernels checks it against
// and the dev harness (tests/unit/kernels/attention_variants.cpp) validates
// every variant against before timing it.
//
// One (head, query block) at a time: scores for one key tile come from one
// GEMM, the online softmax updates the running row max m and row sum l, and
// the tile's P·V is added by a second GEMM. Backward recomputes each tile's
// probabilities from the given lse and issues the four gradient GEMMs. Query
// head h reads kv head h / (H / Hkv) through the row stride Hkv * D, so GQA
// needs no copy.
//
// The GEMMs are gemm_direct's (gemm_direct.hpp), which read A where it lies
// (Q, dO, P, dS) and B by rows or, where gemm_direct is native (AVX-512), in
// panels of 32 columns: K (and in backward V) is transposed once per kv head
// and call into the workspace, so that Q·Kᵀ and dO·Vᵀ read Kᵀ and Vᵀ; where
// native, V (forward), K (backward) and each query block's Q and dO
// (backward) are copied into panels too, once per kv head or block, and the
// softmax's exponentials and the backward's dS are computed in the GEMM
// tiles that produce S and dP. OpenBLAS would copy both operands of every
// tile's GEMMs, the same K and V rows once per query block.
//
// A tile whose rows see very different key ranges (the causal diagonal, a
// window's edge, a document boundary) is cut into pieces so that the GEMMs
// skip most masked pairs (attention_tiles.hpp, which the cp layout's cost
// model counts with).
#include "trident/kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gemm_direct.hpp"
#include "scratch.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/attention_tiles.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/reference.hpp"
#include "vector_math.hpp"

// The softmax loops are a sizeable share of the forward's time next to the
// GEMMs; on x86 build them a second time for AVX2/FMA and let the loader pick
// (the baseline build is SSE2 only).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TRIDENT_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TRIDENT_VECTOR_CLONES
#endif

namespace trident::kernels {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Eight floats processed together (GCC/Clang vector extensions): the loops
// below are written on these so that they vectorise by construction, and
// compile to AVX in the x86-64-v3 clone and to SSE pairs otherwise.
// The helpers taking and returning f8 are internal and inlined, so the
// warning that their ABI differs between SSE and AVX builds does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

inline f8 splat(float x) { return f8{x, x, x, x, x, x, x, x}; }
inline f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, const f8& v) { std::memcpy(p, &v, sizeof v); }
// The first n (< 8) lanes from p, the others set to fill.
inline f8 load_part(const float* p, int64_t n, float fill) {
  alignas(32) float t[8];
  for (int u = 0; u < 8; ++u) t[u] = u < n ? p[u] : fill;
  return load8(t);
}
inline void store_part(float* p, int64_t n, const f8& v) {
  alignas(32) float t[8];
  store8(t, v);
  for (int64_t u = 0; u < n; ++u) p[u] = t[u];
}

// exp(x) in fp32 to about one ulp (std::exp is an opaque call that stops
// vectorisation): x = n ln2 + r with |r| <= ln2/2, e^r by its degree-7 Taylor
// polynomial (truncation < 1e-8 relative), 2^n built in the exponent bits.
// Below -87 (including -inf for masked scores) the result is 0.
inline f8 exp8(const f8& x) {
  const f8 lo = splat(-87.0f), hi = splat(88.0f);
  f8 xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  // Adding and removing 1.5 * 2^23 rounds to the nearest integer.
  const f8 magic = splat(12582912.0f);
  const f8 n = (xc * 1.44269504088896341f + magic) - magic;
  // ln2 split in a part exact in fp32 and the rest, so r keeps its bits.
  const f8 r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  f8 p = splat(1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const i8 bits = (__builtin_convertvector(n, i8) + 127) << 23;
  const f8 y = p * (f8)bits;  // reinterprets the bits (same size)
  return x < lo ? splat(0.0f) : y;
}

// Row stride of the transposed K and V: the keys rounded up to 16 floats,
// plus 16 so that the stride is never a power of two (rows at such a stride
// share cache sets).
inline int64_t transposed_stride(const AttnShape& s) { return (s.Tk + 15) / 16 * 16 + 16; }

// Row stride of a tile of scores (and of the backward's P and dP): its
// columns rounded up to 16 floats, plus 16 for the same reason. At the
// tile's full width of 512 keys the rows would otherwise lie 2 KiB apart,
// and the column of P or dS that a transposed-A GEMM reads (one element per
// row) would fall into two cache sets.
inline int64_t tile_stride(int64_t cols) { return (cols + 15) / 16 * 16 + 16; }

inline float hmax(const f8& v) {
  float m = v[0];
  for (int u = 1; u < 8; ++u) m = std::max(m, v[u]);
  return m;
}
inline float hsum(const f8& v) {
  float s = 0.0f;
  for (int u = 0; u < 8; ++u) s += v[u];
  return s;
}

TRIDENT_VECTOR_CLONES float row_max(const float* x, int64_t n) {
  f8 m = splat(kNegInf);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const f8 v = load8(x + j);
    m = v > m ? v : m;
  }
  if (j < n) {
    const f8 v = load_part(x + j, n - j, kNegInf);
    m = v > m ? v : m;
  }
  return hmax(m);
}

// x[j] <- exp(x[j] - m) for j < n, returns the sum.
TRIDENT_VECTOR_CLONES float exp_shift_sum(float* x, int64_t n, float m) {
  f8 sum = splat(0.0f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const f8 e = exp8(load8(x + j) - m);
    store8(x + j, e);
    sum += e;
  }
  if (j < n) {
    const f8 e = exp8(load_part(x + j, n - j, kNegInf) - m);
    store_part(x + j, n - j, e);
    sum += e;
  }
  return hsum(sum);
}

TRIDENT_VECTOR_CLONES void scale_row(float* x, int64_t n, float a) {
  for (int64_t j = 0; j < n; ++j) x[j] *= a;
}

// dS = P * (dP - delta), in place in dp.
TRIDENT_VECTOR_CLONES void softmax_grad_row(const float* p, float* dp, int64_t n, float delta) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) store8(dp + j, load8(p + j) * (load8(dp + j) - delta));
  for (; j < n; ++j) dp[j] = p[j] * (dp[j] - delta);
}

// One lane's exp, for the scalar places (alpha of the online softmax).
inline float exp1(float x) { return exp8(splat(x))[0]; }

struct Strides {
  int64_t q, kv;  // row strides of [T, H, D] and [T, Hkv, D]
};

// The Tk rows of one kv head (x points at the head's first element)
// transposed, the B operand of Q·Kᵀ and dO·Vᵀ: where gemm_direct is native in
// panels of kPanel keys (D x kPanel floats each, one after the other; see
// gemm_direct.hpp), elsewhere by rows, kt[d * ldt + j] = x[j * ld + d].
void transpose_keys(bool panels, const float* x, int64_t ld, int64_t Tk, int64_t D, float* kt,
                    int64_t ldt) {
  if (panels)
    cpu::transpose_panels(x, ld, Tk, D, kt, D * cpu::kPanel);
  else
    cpu::transpose_rows(x, ld, Tk, D, kt, ldt);
}

// Floats of an operand of `rows` rows by D columns in panels (pack_panels).
inline int64_t panel_floats(int64_t rows, int64_t D) {
  return (D + cpu::kPanel - 1) / cpu::kPanel * cpu::kPanel * rows;
}

// C = alpha op(A) B + beta C, B held both ways: by rows (b, ldb) for
// gemm_direct, and in panels (bp) where gemm_direct is native.
void gemm_b(const Ctx& ctx, bool panels, bool a_trans, int64_t M, int64_t N, int64_t K, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, cpu::PanelB bp, float beta,
            float* c, int64_t ldc) {
  if (panels)
    cpu::gemm_direct_panels(a_trans, M, N, K, alpha, a, lda, bp, beta, c, ldc);
  else
    cpu::gemm_direct(ctx, a_trans, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace

void check_attn_shape(const AttnShape& s) {
  TRIDENT_CHECK(s.Tq >= 0 && s.Tk >= 0, "attention: negative token count");
  TRIDENT_CHECK(s.H > 0 && s.Hkv > 0 && s.D > 0, "attention: H, Hkv and D must be positive");
  TRIDENT_CHECK((s.q_doc == nullptr) == (s.k_doc == nullptr),
                "attention: document ids for the queries and not the keys, or the reverse");
  TRIDENT_CHECK(s.window >= 0, "attention: window " + std::to_string(s.window) + " < 0");
  TRIDENT_CHECK(s.H % s.Hkv == 0, "attention: n_heads (" + std::to_string(s.H) +
                                      ") must be a multiple of n_kv_heads (" +
                                      std::to_string(s.Hkv) + ")");
}

}  // namespace trident::kernels

namespace trident::kernels::cpu {
namespace {

// The forward's per-call state: the query block's running softmax (m, l)
// and P·V accumulator, one key tile's scores, and the kv head's Kᵀ (and V
// in panels where gemm_direct is native).
struct ForwardState {
  const Ctx& ctx;
  const AttnShape& s;
  Strides ld;
  bool native;  // where gemm_direct is native: Kᵀ and V in panels, the row passes in AVX-512
  float *scores = nullptr, *acc = nullptr, *m = nullptr, *l = nullptr;
  float *kt = nullptr, *vpan = nullptr;
  int64_t ldt = 0;
};

// Seeds the block's running state: empty, or with resume the (out, lse) of
// earlier keys (running max m = lse, running sum l = 1, acc = out).
void forward_seed_rows(ForwardState& f, const float* out, const float* lse, bool resume, int h,
                       int64_t i0, int64_t rows) {
  const int64_t D = f.s.D;
  for (int64_t i = 0; i < rows; ++i) {
    const float* orow = out + (i0 + i) * f.ld.q + int64_t(h) * D;
    const float row_lse = resume ? lse[(i0 + i) * f.s.H + h] : kNegInf;
    f.m[i] = row_lse;
    f.l[i] = row_lse == kNegInf ? 0.0f : 1.0f;
    if (row_lse == kNegInf)
      std::fill(f.acc + i * D, f.acc + (i + 1) * D, 0.0f);
    else
      std::copy(orow, orow + D, f.acc + i * D);
  }
}

// The online softmax over one tile's scores: each row's new max, its
// rescaled sum and accumulator, the scores turned into exp(s - m).
void forward_softmax_rows(ForwardState& f, const AttnTile& tile, int64_t rows, int64_t lds) {
  for (int64_t i = 0; i < rows; ++i) {
    float* srow = f.scores + i * lds;
    const int64_t a = tile.lo[i], n = tile.n[i];
    const float m_new =
        std::max(f.m[i], f.native ? row_max_native(srow + a, n) : row_max(srow + a, n));
    if (m_new == kNegInf) {  // nothing visible yet: the row stays empty
      attn_zero_masked(tile, i, srow);
      continue;
    }
    // exp1 gives exactly 1 for 0 and 0 below -87 (-inf: the row's first keys)
    const float alpha = f.m[i] == m_new ? 1.0f : (f.m[i] == kNegInf ? 0.0f : exp1(f.m[i] - m_new));
    f.l[i] = f.l[i] * alpha + (f.native ? exp_shift_sum_native(srow + a, n, m_new)
                                        : exp_shift_sum(srow + a, n, m_new));
    attn_zero_masked(tile, i, srow);
    if (alpha != 1.0f) scale_row(f.acc + i * f.s.D, f.s.D, alpha);
    f.m[i] = m_new;
  }
}

// One key tile of the query block at qb (kv head g): S = scale Q·Kᵀ over
// the tile's pieces, the online softmax, acc += P·V.
void forward_tile(ForwardState& f, const AttnTile& tile, int64_t jt, int64_t rows, const float* qb,
                  const float* v, int g) {
  const int64_t D = f.s.D;
  const int64_t j0 = jt + tile.c0, cols = tile.c1 - tile.c0;
  const int64_t lds = tile_stride(cols);
  const float* vb = v + j0 * f.ld.kv + int64_t(g) * D;
  for (int u = 0; u < tile.n_pieces; ++u) {
    const AttnPiece& pc = tile.piece[u];
    gemm_b(f.ctx, f.native, false, pc.r1 - pc.r0, pc.c1 - pc.c0, D, f.s.scale, qb + pc.r0 * f.ld.q,
           f.ld.q, f.kt + j0 + pc.c0, f.ldt, PanelB{f.kt, D * kPanel, j0 + pc.c0}, 0.0f,
           f.scores + pc.r0 * lds + pc.c0, lds);
  }
  forward_softmax_rows(f, tile, rows, lds);
  for (int u = 0; u < tile.n_pieces; ++u) {
    const AttnPiece& pc = tile.piece[u];
    gemm_b(f.ctx, f.native, false, pc.r1 - pc.r0, D, pc.c1 - pc.c0, 1.0f,
           f.scores + pc.r0 * lds + pc.c0, lds, vb + pc.c0 * f.ld.kv, f.ld.kv,
           PanelB{f.vpan + (j0 + pc.c0) * kPanel, f.s.Tk * kPanel, 0}, 1.0f, f.acc + pc.r0 * D, D);
  }
}

// out = acc / l and lse = m + log l for the block's rows (a fully masked
// row: zero output, LSE -inf).
void forward_finish_rows(const ForwardState& f, float* out, float* lse, int h, int64_t i0,
                         int64_t rows) {
  const int64_t D = f.s.D;
  for (int64_t i = 0; i < rows; ++i) {
    float* orow = out + (i0 + i) * f.ld.q + int64_t(h) * D;
    float& lrow = lse[(i0 + i) * f.s.H + h];
    if (f.l[i] > 0.0f) {
      const float inv = 1.0f / f.l[i];
      for (int64_t d = 0; d < D; ++d) orow[d] = f.acc[i * D + d] * inv;
      lrow = f.m[i] + std::log(f.l[i]);
    } else {
      std::fill(orow, orow + D, 0.0f);
      lrow = kNegInf;
    }
  }
}

// The forward of both entry points. With resume, (out, lse) hold the
// attention over the keys of earlier calls and seed the online softmax:
// running max m = lse, running sum l = 1, accumulator = out is the same state
// as after those keys (out = acc / l, lse = m + log l), so continuing over this
// call's keys yields exactly the merged result.
void forward_impl(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                  const float* v, float* out, float* lse, bool resume) {
  check_attn_shape(s);
  const int group = s.H / s.Hkv;
  const int64_t D = s.D;
  Scratch scratch(ctx, attention_workspace_bytes(s, false) / sizeof(float));
  ForwardState f{ctx, s, Strides{int64_t(s.H) * s.D, int64_t(s.Hkv) * s.D}, gemm_direct_native()};
  f.scores = scratch.take(size_t(kQueryBlock * tile_stride(kKeyBlock)));
  f.acc = scratch.take(size_t(kQueryBlock * D));  // running P·V of the query block
  f.m = scratch.take(kQueryBlock);
  f.l = scratch.take(kQueryBlock);
  f.ldt = transposed_stride(s);
  f.kt = scratch.take(size_t(D * f.ldt));                // K of the kv head, transposed
  f.vpan = scratch.take(size_t(panel_floats(s.Tk, D)));  // V of the kv head in panels
  AttnTile tile;
  for (int h = 0; h < s.H; ++h) {
    const int g = h / group;
    if (h % group == 0) {
      transpose_keys(f.native, k + int64_t(g) * D, f.ld.kv, s.Tk, D, f.kt, f.ldt);
      if (f.native) pack_panels(v + int64_t(g) * D, f.ld.kv, s.Tk, D, f.vpan, s.Tk * kPanel);
    }
    for (int64_t i0 = 0; i0 < s.Tq; i0 += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, s.Tq - i0);
      forward_seed_rows(f, out, lse, resume, h, i0, rows);
      attn_for_each_key_tile(s, i0, rows, tile, [&](const AttnTile& t, int64_t jt) {
        forward_tile(f, t, jt, rows, q + i0 * f.ld.q + int64_t(h) * D, v, g);
      });
      forward_finish_rows(f, out, lse, h, i0, rows);
    }
  }
}

}  // namespace

void attention_forward(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                       const float* v, float* out, float* lse) {
  forward_impl(ctx, s, q, k, v, out, lse, false);
}

void attention_forward_resume(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                              const float* v, float* out, float* lse) {
  forward_impl(ctx, s, q, k, v, out, lse, true);
}

namespace {

// The backward's per-call state: one tile's P and dP (then dS), the query
// block's delta and lse, the kv head's Kᵀ and Vᵀ, and where gemm_direct is
// native (fused) K, Q and dO in panels.
struct BackwardState {
  const Ctx& ctx;
  const AttnShape& s;
  Strides ld;
  // Where gemm_direct is native, every B operand is read in panels (Kᵀ, Vᵀ
  // and K once per kv head, the query block's Q and dO once per block), and the
  // exponentials (P = exp(S - lse)) and the softmax gradient (dS = P (dP -
  // delta)) are computed by the GEMMs' tiles before they store S and dP, with
  // the roundings of the passes below.
  bool fused;
  float *p = nullptr, *dp = nullptr, *delta = nullptr, *row_lse = nullptr;
  float *kt = nullptr, *vt = nullptr, *kpan = nullptr, *qpan = nullptr, *dopan = nullptr;
  int64_t ldt = 0, kv_panel = 0, q_panel = 0;
};

// delta of every (query, head) = rowsum(dO * O), computed first in one pass
// over O and dO in memory order (each token's heads are one contiguous row):
// per query block and head the rows lie H * D floats apart, and O is not read
// otherwise, so the same dot products there waited on memory (1.3% of the
// benchmark model's step on a Zen 5 core).
void backward_deltas(const AttnShape& s, const Strides& ld, const float* out, const float* dout,
                     float* delta_all) {
  for (int64_t i = 0; i < s.Tq; ++i)
    for (int h = 0; h < s.H; ++h) {
      const int64_t o = i * ld.q + int64_t(h) * s.D;
      delta_all[i * s.H + h] = float(dot_d(dout + o, out + o, s.D));
    }
}

// P = exp(scale Q·Kᵀ - lse) over one tile's pieces, zero outside each row's keys.
void backward_probs(BackwardState& b, const AttnTile& tile, int64_t j0, int64_t lds, int64_t rows,
                    const float* qb) {
  const int64_t D = b.s.D;
  for (int u = 0; u < tile.n_pieces; ++u) {
    const AttnPiece& pc = tile.piece[u];
    const float* qp = qb + pc.r0 * b.ld.q;
    float* pp = b.p + pc.r0 * lds + pc.c0;
    if (b.fused)
      gemm_direct_rows(RowOp::kExp, pc.r1 - pc.r0, pc.c1 - pc.c0, D, b.s.scale, qp, b.ld.q,
                       PanelB{b.kt, D * kPanel, j0 + pc.c0}, pp, lds, b.row_lse + pc.r0, nullptr,
                       0);
    else
      gemm_direct(b.ctx, false, pc.r1 - pc.r0, pc.c1 - pc.c0, D, b.s.scale, qp, b.ld.q,
                  b.kt + j0 + pc.c0, b.ldt, 0.0f, pp, lds);
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* prow = b.p + i * lds;
    if (b.row_lse[i] == kNegInf) {
      std::fill(prow + tile.f0[i / kAttnRowBand], prow + tile.f1[i / kAttnRowBand], 0.0f);
      continue;
    }
    if (!b.fused) exp_shift_sum(prow + tile.lo[i], tile.n[i], b.row_lse[i]);
    attn_zero_masked(tile, i, prow);
  }
}

// dV += Pᵀ dO and dS = P (dP - delta) with dP = dO Vᵀ, over one tile's pieces.
void backward_dv_ds(BackwardState& b, const AttnTile& tile, int64_t j0, int64_t lds, int64_t rows,
                    const float* dob, float* dvb) {
  const int64_t D = b.s.D;
  for (int u = 0; u < tile.n_pieces; ++u) {
    const AttnPiece& pc = tile.piece[u];
    const int64_t pr = pc.r1 - pc.r0, pn = pc.c1 - pc.c0, at = pc.r0 * lds + pc.c0;
    gemm_b(b.ctx, b.fused, true, pn, D, pr, 1.0f, b.p + at, lds, dob + pc.r0 * b.ld.q, b.ld.q,
           PanelB{b.dopan + pc.r0 * kPanel, b.q_panel, 0}, 1.0f, dvb + pc.c0 * b.ld.kv, b.ld.kv);
    if (b.fused)
      gemm_direct_rows(RowOp::kGrad, pr, pn, D, 1.0f, dob + pc.r0 * b.ld.q, b.ld.q,
                       PanelB{b.vt, D * kPanel, j0 + pc.c0}, b.dp + at, lds, b.delta + pc.r0,
                       b.p + at, lds);
    else
      gemm_direct(b.ctx, false, pr, pn, D, 1.0f, dob + pc.r0 * b.ld.q, b.ld.q, b.vt + j0 + pc.c0,
                  b.ldt, 0.0f, b.dp + at, lds);
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* dprow = b.dp + i * lds;
    const int64_t a = tile.lo[i], n = tile.n[i];
    if (!b.fused) softmax_grad_row(b.p + i * lds + a, dprow + a, n, b.delta[i]);
    attn_zero_masked(tile, i, dprow);
  }
}

// One key tile of the query block (q, dO, dQ at qb, dob, dqb; K, dK, dV rows
// of the tile from koff): P, then dV += Pᵀ dO, dS, dQ += s dS K, dK += s dSᵀ Q,
// each over the tile's pieces (P and dS are zero outside every row's keys).
void backward_tile(BackwardState& b, const AttnTile& tile, int64_t jt, int64_t rows,
                   const float* qb, const float* dob, float* dqb, const float* k, float* dk,
                   float* dv, int g) {
  const int64_t D = b.s.D;
  const int64_t j0 = jt + tile.c0, cols = tile.c1 - tile.c0;
  const int64_t lds = tile_stride(cols);
  const int64_t koff = j0 * b.ld.kv + int64_t(g) * D;
  backward_probs(b, tile, j0, lds, rows, qb);
  backward_dv_ds(b, tile, j0, lds, rows, dob, dv + koff);
  for (int u = 0; u < tile.n_pieces; ++u) {
    const AttnPiece& pc = tile.piece[u];
    const int64_t pr = pc.r1 - pc.r0, pn = pc.c1 - pc.c0, at = pc.r0 * lds + pc.c0;
    gemm_b(b.ctx, b.fused, false, pr, D, pn, b.s.scale, b.dp + at, lds, k + koff + pc.c0 * b.ld.kv,
           b.ld.kv, PanelB{b.kpan + (j0 + pc.c0) * kPanel, b.kv_panel, 0}, 1.0f,
           dqb + pc.r0 * b.ld.q, b.ld.q);
    gemm_b(b.ctx, b.fused, true, pn, D, pr, b.s.scale, b.dp + at, lds, qb + pc.r0 * b.ld.q, b.ld.q,
           PanelB{b.qpan + pc.r0 * kPanel, b.q_panel, 0}, 1.0f, dk + koff + pc.c0 * b.ld.kv,
           b.ld.kv);
  }
}

// The query block at i0 of head h: its panels, delta and lse, then its tiles.
void backward_block(BackwardState& b, int h, int64_t i0, const float* delta_all, const float* lse,
                    const float* q, const float* k, const float* dout, float* dq, float* dk,
                    float* dv) {
  const AttnShape& s = b.s;
  const int64_t rows = std::min(kQueryBlock, s.Tq - i0);
  const int64_t off = i0 * b.ld.q + int64_t(h) * s.D;
  if (b.fused) {
    pack_panels(q + off, b.ld.q, rows, s.D, b.qpan, b.q_panel);
    pack_panels(dout + off, b.ld.q, rows, s.D, b.dopan, b.q_panel);
  }
  for (int64_t i = 0; i < rows; ++i) {
    b.delta[i] = delta_all[(i0 + i) * s.H + h];
    b.row_lse[i] = lse[(i0 + i) * s.H + h];
  }
  AttnTile tile;
  attn_for_each_key_tile(s, i0, rows, tile, [&](const AttnTile& t, int64_t jt) {
    backward_tile(b, t, jt, rows, q + off, dout + off, dq + off, k, dk, dv, h / (s.H / s.Hkv));
  });
}

}  // namespace

void attention_backward(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv) {
  check_attn_shape(s);
  const int group = s.H / s.Hkv;
  const int64_t D = s.D;
  Scratch scratch(ctx, attention_workspace_bytes(s, true) / sizeof(float));
  BackwardState b{ctx, s, Strides{int64_t(s.H) * s.D, int64_t(s.Hkv) * s.D}, false};
  b.p = scratch.take(size_t(kQueryBlock * tile_stride(kKeyBlock)));
  b.dp = scratch.take(size_t(kQueryBlock * tile_stride(kKeyBlock)));
  b.delta = scratch.take(kQueryBlock);    // rowsum(dO * O): softmax's Jacobian term
  b.row_lse = scratch.take(kQueryBlock);  // the query block's lse, contiguous
  float* delta_all = scratch.take(size_t(s.Tq * s.H));
  backward_deltas(s, b.ld, out, dout, delta_all);
  b.fused = gemm_direct_native();
  b.ldt = transposed_stride(s);
  b.kt = scratch.take(size_t(D * b.ldt));  // K and V of the kv head, transposed
  b.vt = scratch.take(size_t(D * b.ldt));
  b.kpan = scratch.take(size_t(panel_floats(s.Tk, D)));          // K in panels
  b.qpan = scratch.take(size_t(panel_floats(kQueryBlock, D)));   // the block's Q in panels
  b.dopan = scratch.take(size_t(panel_floats(kQueryBlock, D)));  // and its dO
  b.kv_panel = s.Tk * kPanel, b.q_panel = kQueryBlock * kPanel;
  for (int h = 0; h < s.H; ++h) {
    const int g = h / group;
    if (h % group == 0) {
      transpose_keys(b.fused, k + int64_t(g) * D, b.ld.kv, s.Tk, D, b.kt, b.ldt);
      transpose_keys(b.fused, v + int64_t(g) * D, b.ld.kv, s.Tk, D, b.vt, b.ldt);
      if (b.fused) pack_panels(k + int64_t(g) * D, b.ld.kv, s.Tk, D, b.kpan, b.kv_panel);
    }
    for (int64_t i0 = 0; i0 < s.Tq; i0 += kQueryBlock)
      backward_block(b, h, i0, delta_all, lse, q, k, dout, dq, dk, dv);
  }
}

void merge_partial_attention(const Ctx& ctx, int64_t n_rows, int D, float* out, float* lse,
                             const float* out_b, const float* lse_b) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float a = lse[r], b = lse_b[r];
    if (b == kNegInf) continue;  // the block saw nothing for this row
    float* o = out + r * D;
    const float* ob = out_b + r * D;
    if (a == kNegInf) {  // first block that sees anything for this row
      std::copy(ob, ob + D, o);
      lse[r] = b;
      continue;
    }
    // sigmoid(b - a) is the block's share of the combined softmax mass.
    const float w = 1.0f / (1.0f + std::exp(a - b));
    for (int d = 0; d < D; ++d) o[d] -= w * (o[d] - ob[d]);
    // lse - log sigmoid(lse - lse_b) = max + log1p(exp(-|a - b|)), stable.
    lse[r] = std::max(a, b) + std::log1p(std::exp(-std::fabs(a - b)));
  }
}

}  // namespace trident::kernels::cpu

namespace trident::kernels {

int64_t attention_visible_pairs(const AttnShape& s) {
  if (!s.causal && !s.documents() && s.window == 0) return s.Tq * s.Tk * s.H;
  int64_t pairs = 0;
  for (int64_t i = 0; i < s.Tq; ++i) {
    int64_t a, b;
    attn_row_keys(s, i, 0, s.Tk, &a, &b);
    pairs += b - a;
  }
  return pairs * s.H;
}

double attention_flops(const AttnShape& s, bool backward) {
  return (backward ? 10.0 : 4.0) * double(s.D) * double(attention_visible_pairs(s));
}

double attention_reference_row(const AttnShape& s, const float* q, const float* k, const float* v,
                               int64_t i, int h, double* out_row) {
  check_attn_shape(s);
  const int64_t D = s.D, g = h / (s.H / s.Hkv);
  const float* qi = q + (i * s.H + h) * D;
  std::vector<double> score(size_t(s.Tk), -INFINITY);
  double mx = -INFINITY;
  for (int64_t j = 0; j < s.Tk; ++j) {
    if (!attn_pair_visible(s, s.q_pos0 + i, s.k_pos0 + j, s.documents() ? s.q_doc[i] : 0,
                           s.documents() ? s.k_doc[j] : 0))
      continue;
    const float* kj = k + (j * s.Hkv + g) * D;
    double dot = 0.0;
    for (int64_t d = 0; d < D; ++d) dot += double(qi[d]) * kj[d];
    score[size_t(j)] = dot * s.scale;
    mx = std::max(mx, score[size_t(j)]);
  }
  std::fill(out_row, out_row + D, 0.0);
  if (mx == -INFINITY) return -INFINITY;
  double sum = 0.0;
  for (int64_t j = 0; j < s.Tk; ++j) {
    if (score[size_t(j)] == -INFINITY) continue;
    const double p = std::exp(score[size_t(j)] - mx);
    sum += p;
    const float* vj = v + (j * s.Hkv + g) * D;
    for (int64_t d = 0; d < D; ++d) out_row[d] += p * vj[d];
  }
  for (int64_t d = 0; d < D; ++d) out_row[d] /= sum;
  return mx + std::log(sum);
}

size_t attention_workspace_bytes(const AttnShape& s, bool backward) {
  const size_t tile = size_t(kQueryBlock * tile_stride(kKeyBlock));
  const size_t transposed = size_t(s.D) * size_t(transposed_stride(s));
  // K (backward) or V (forward) in panels, and the backward's Q and dO blocks
  const size_t kv_panels = size_t(panel_floats(s.Tk, s.D));
  const size_t q_panels = size_t(panel_floats(kQueryBlock, s.D));
  if (backward)
    return sizeof(float) * (2 * tile + 2 * size_t(kQueryBlock) + 2 * transposed + kv_panels +
                            2 * q_panels + size_t(s.Tq) * size_t(s.H));
  return sizeof(float) * (tile + size_t(kQueryBlock) * size_t(s.D) + 2 * size_t(kQueryBlock) +
                          transposed + kv_panels);
}

}  // namespace trident::kernels
