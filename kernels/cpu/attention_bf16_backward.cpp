// Attention's backward on AVX512-BF16 (cpu_bf16.hpp; the forward is
// attention_bf16.cpp): P = exp(scale Q·Kᵀ - lse), dV += Pᵀ·dO, dP = dO·Vᵀ,
// dS = P (dP - delta), dQ += scale dS·K, dK += scale dSᵀ·Q, the products on
// bf16 operands with fp32 accumulation, P and dS rounded to bf16 for the
// products that read them, delta = rowsum(dO·O) and dS in fp32.
//
// Kᵀ, Vᵀ (panels of keys) and K (in key pairs) are packed once per kv head,
// each query block's Q and dO once per block and head (in strips of kRb rows
// and in row pairs; attention_bf16_tile.hpp). Per (query block, key tile),
// one register tile computes S and dP for kRb rows by 32 keys and turns them
// into P and dS before anything is stored: dS by rows (for dQ) and P and dS
// in row pairs (Pᵀ, dSᵀ: for dV and dK), all bf16. The gradients are added
// to in fp32.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention_bf16_tile.hpp"
#include "scratch.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/cpu_bf16.hpp"

namespace trident::kernels::cpu {

#ifdef TRIDENT_ATTN_BF16
namespace {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

using namespace attn16;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kLog2e_d = 1.44269504088896341;  // lse to log2 units

constexpr int kRb = 6;                     // query rows of the S/dP register tile
constexpr int64_t kBq = 192;               // query rows per block
constexpr int64_t kBk = 256;               // keys per tile
constexpr int kStrips = int(kBq / kRb);    // strips of a block
constexpr int kLdDs = int(kBk / 2 + 8);    // words per row of the tile's dS
constexpr int64_t kTPanel = kBq / 2 * kW;  // words per key panel of Pᵀ and dSᵀ

// The backward's state: the shape and gradients, the kv head's packs, the
// query block's packs and rows, the tile's P and dS and which key panels
// [pl, ph) (of the tile) each strip computed.
struct Backward {
  const AttnShape* s = nullptr;
  const uint16_t *q = nullptr, *out = nullptr, *dout = nullptr;  // K and V: packed per kv head
  const float* lse_all = nullptr;
  float *dq = nullptr, *dk = nullptr, *dv = nullptr;
  int64_t ldq = 0, ldkv = 0, Dp = 0, Dn = 0, kt_panel = 0, kp_stride = 0;
  uint32_t *kt = nullptr, *vt = nullptr, *kp = nullptr;                   // Kᵀ, Vᵀ, K
  uint32_t *qs = nullptr, *dos = nullptr, *qp = nullptr, *dop = nullptr;  // Q, dO
  uint32_t *pt = nullptr, *dst = nullptr, *dsr = nullptr;                 // Pᵀ, dSᵀ, dS
  // the block's rows: lse, lse log2(e) (P's exponent), delta = rowsum(dO O)
  float lse[kBq] = {}, lse2[kBq] = {}, delta[kBq] = {};
  int64_t a[kBq] = {}, b[kBq] = {};
  int64_t pl[kStrips] = {}, ph[kStrips] = {};
  int64_t fa[kStrips] = {}, fb[kStrips] = {};  // the keys every row of a strip sees
  int64_t lo[kStrips] = {}, hi[kStrips] = {};  // those some row sees, in the tile
};

// 16 bf16 values widened to f32.
TRIDENT_ATTN_INLINE __m512 widen16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// sum x[d] y[d] over the bf16 rows x, y of n values, in fp32.
TRIDENT_ATTN_TARGET float dot_bf16(const uint16_t* x, const uint16_t* y, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) acc = _mm512_fmadd_ps(widen16(x + d), widen16(y + d), acc);
  float sum = _mm512_reduce_add_ps(acc);
  for (; d < n; ++d) {
    const uint32_t u = uint32_t(x[d]) << 16, w = uint32_t(y[d]) << 16;
    float fu, fw;
    std::memcpy(&fu, &u, 4);
    std::memcpy(&fw, &w, 4);
    sum += fu * fw;
  }
  return sum;
}

// Row r's P and dS for one S/dP tile row (dP from -delta, so dP - delta):
// 2^(scale log2(e) S - lse log2(e)) where the key is visible (the mask, when
// not every key of the panel is), else 0, and P (dP - delta).
TRIDENT_ATTN_INLINE void probs_grads(const Backward& b, int64_t row, int64_t col0, bool full,
                                     __m512 (&s)[2], __m512 (&dp)[2]) {
  const __m512 sc = _mm512_set1_ps(b.s->scale * kLog2e), l = _mm512_set1_ps(b.lse2[row]);
  s[0] = exp2_fast(_mm512_fmsub_ps(s[0], sc, l));
  s[1] = exp2_fast(_mm512_fmsub_ps(s[1], sc, l));
  if (!full) {
    const uint32_t mk = col_mask(b.a[row], b.b[row], col0);
    s[0] = _mm512_maskz_mov_ps(__mmask16(mk), s[0]);
    s[1] = _mm512_maskz_mov_ps(__mmask16(mk >> 16), s[1]);
  }
  dp[0] = _mm512_mul_ps(s[0], dp[0]);
  dp[1] = _mm512_mul_ps(s[1], dp[1]);
}

// The register tile of strip st (rows st kRb ...) and the tile's key panel
// p (keys jt + 32 p ...): S and dP, then P and dS, stored as dS's rows and
// as Pᵀ's and dSᵀ's row pairs. A half of the panel that no row of the strip
// sees is not computed: the mask makes its P and dS 0.
TRIDENT_ATTN_TARGET void strip_panel(Backward& b, int st, int64_t jt, int64_t p) {
  const int64_t J = jt / kW + p;
  const bool full = b.fa[st] <= J * kW && (J + 1) * kW <= b.fb[st];  // no row masks a key
  const int half = panel_half(b.lo[st], b.hi[st], J * kW);
  __m512 s[kRb][2], dp[kRb][2];
  zero_tile(s);
#pragma GCC unroll 6
  for (int r = 0; r < kRb; ++r) dp[r][0] = dp[r][1] = _mm512_set1_ps(-b.delta[st * kRb + r]);
  dot_tile_half<kRb, 1>(half, b.qs + st * b.Dp * kRb, kRb, b.kt + J * b.kt_panel, b.Dp, s);
  dot_tile_half<kRb, 1>(half, b.dos + st * b.Dp * kRb, kRb, b.vt + J * b.kt_panel, b.Dp, dp);
#pragma GCC unroll 6
  for (int r = 0; r < kRb; ++r) {
    const int64_t row = int64_t(st) * kRb + r;
    probs_grads(b, row, J * kW, full, s[r], dp[r]);
    _mm512_storeu_si512(b.dsr + row * kLdDs + p * (kW / 2), bf16_row(dp[r][0], dp[r][1]));
  }
#pragma GCC unroll 3
  for (int r = 0; r < kRb; r += 2) {
    const int64_t at = p * kTPanel + (int64_t(st) * kRb + r) / 2 * kW;
    _mm512_storeu_si512(b.pt + at, bf16_pairs(s[r][0], s[r + 1][0]));
    _mm512_storeu_si512(b.pt + at + 16, bf16_pairs(s[r][1], s[r + 1][1]));
    _mm512_storeu_si512(b.dst + at, bf16_pairs(dp[r][0], dp[r + 1][0]));
    _mm512_storeu_si512(b.dst + at + 16, bf16_pairs(dp[r][1], dp[r + 1][1]));
  }
}

// The row pairs of [t0, t0 + np) of the block from the first to the last
// that holds a row seeing one of the keys [k0, k1) (the others' P and dS of
// those keys are 0); np 0 when none does.
void rows_for_keys(const Backward& b, int64_t k0, int64_t k1, int64_t& t0, int64_t& np) {
  const auto sees = [&](int64_t row) {
    return b.a[row] < k1 && b.b[row] > k0 && b.a[row] < b.b[row];
  };
  int64_t r0 = 2 * t0, r1 = 2 * (t0 + np);
  while (r0 < r1 && !sees(r0)) ++r0;
  while (r1 > r0 && !sees(r1 - 1)) --r1;
  t0 = r0 / 2, np = r1 > r0 ? (r1 + 1) / 2 - t0 : 0;
}

// dV += Pᵀ dO and dK += scale dSᵀ Q for R keys of key panel p (from key
// k0 of the panel, `keys` of them inside Tk), over the row pairs of [t0, t0 +
// np) of the block that see them.
template <int R>
TRIDENT_ATTN_TARGET void kv_grads(const Backward& b, int64_t jt, int64_t p, int k0, int keys,
                                  int64_t t0, int64_t np) {
  const int64_t key = jt + p * kW + k0;
  rows_for_keys(b, key, key + keys, t0, np);
  if (np == 0) return;
  const int64_t at = p * kTPanel + t0 * kW + k0;
  for (int64_t dn = 0; dn < b.Dn; ++dn) {
    const int64_t cols = std::min<int64_t>(kW, b.s->D - dn * kW);
    const int64_t c = key * b.ldkv + dn * kW;
    __m512 acc[R][2];
    zero_tile(acc);
    dot_tile<R, 1>(b.pt + at, kW, b.dop + dn * kTPanel + t0 * kW, np, acc);
    add_tile(acc, b.dv + c, b.ldkv, keys, cols, 1.0f);
    zero_tile(acc);
    dot_tile<R, 1>(b.dst + at, kW, b.qp + dn * kTPanel + t0 * kW, np, acc);
    add_tile(acc, b.dk + c, b.ldkv, keys, cols, b.s->scale);
  }
}

// dV and dK of the tile's key panel p: the strips that computed it, its keys
// in register tiles of 12, 12 and 8. Those strips are consecutive (each
// row's keys are one interval whose ends do not decrease from row to row,
// AttnShape's documents being non-decreasing); a strip between them that
// did not compute the panel, which that rules out, would read zeros rather
// than another tile's P and dS.
void panel_kv_grads(Backward& b, int64_t jt, int64_t p, int ns) {
  int first = -1, last = -1;
  for (int st = 0; st < ns; ++st)
    if (b.pl[st] <= p && p < b.ph[st]) first = first < 0 ? st : first, last = st;
  if (first < 0) return;
  for (int st = first + 1; st < last; ++st)
    if (!(b.pl[st] <= p && p < b.ph[st])) {
      const int64_t at = p * kTPanel + int64_t(st) * kRb / 2 * kW;
      std::fill_n(b.pt + at, kRb / 2 * kW, 0u);
      std::fill_n(b.dst + at, kRb / 2 * kW, 0u);
    }
  const int64_t t0 = int64_t(first) * kRb / 2, np = int64_t(last - first + 1) * kRb / 2;
  const int keys = int(std::min<int64_t>(kW, b.s->Tk - (jt + p * kW)));
  if (keys > 0) kv_grads<12>(b, jt, p, 0, std::min(keys, 12), t0, np);
  if (keys > 12) kv_grads<12>(b, jt, p, 12, std::min(keys - 12, 12), t0, np);
  if (keys > 24) kv_grads<8>(b, jt, p, 24, keys - 24, t0, np);
}

// dQ += scale dS K for strip st of the tile at key jt, from its dS rows
// while they are in the first-level cache (dq at the strip's first row and
// the head; n of its rows inside the block).
TRIDENT_ATTN_TARGET void strip_dq(const Backward& b, int st, float* dq, int64_t jt, int n) {
  // the key pairs from the strip's first key to its last (dS is 0 outside)
  const int64_t pl = (b.lo[st] - jt) / 2, np = (b.hi[st] - jt + 1) / 2 - pl;
  for (int64_t dn = 0; dn < b.Dn; ++dn) {
    __m512 acc[kRb][2];
    zero_tile(acc);
    dot_tile<kRb, kLdDs>(b.dsr + int64_t(st) * kRb * kLdDs + pl, 1,
                         b.kp + dn * b.kp_stride + (jt / 2 + pl) * kW, np, acc);
    add_tile(acc, dq + dn * kW, b.ldq, n, std::min<int64_t>(kW, b.s->D - dn * kW), b.s->scale);
  }
}

// The key panels [pl, ph) of the tile at jt that strip st computes: those
// that hold a key one of its rows sees.
void strip_panels(Backward& b, int st, int64_t jt, int64_t jn) {
  int64_t lo = jt + jn, hi = jt;
  b.fa[st] = 0, b.fb[st] = b.s->Tk;
  for (int64_t row = int64_t(st) * kRb; row < int64_t(st + 1) * kRb; ++row) {
    if (b.b[row] > b.a[row]) lo = std::min(lo, b.a[row]), hi = std::max(hi, b.b[row]);
    b.fa[st] = std::max(b.fa[st], b.a[row]), b.fb[st] = std::min(b.fb[st], b.b[row]);
  }
  lo = std::max(lo, jt), hi = std::min(hi, jt + jn);
  b.lo[st] = lo, b.hi[st] = hi;
  b.pl[st] = hi > lo ? (lo - jt) / kW : 0;
  b.ph[st] = hi > lo ? (hi - jt + kW - 1) / kW : 0;
}

// The tile of keys [jt, jt + jn) of the block (rows from i0 of head h): per
// strip its panels' P and dS and its dQ, then dV and dK per key panel.
void backward_tile(Backward& b, int h, int64_t i0, int rows, int64_t jt, int64_t jn) {
  const int ns = (rows + kRb - 1) / kRb;
  for (int st = 0; st < ns; ++st) {
    strip_panels(b, st, jt, jn);
    if (b.ph[st] <= b.pl[st]) continue;
    for (int64_t p = b.pl[st]; p < b.ph[st]; ++p) strip_panel(b, st, jt, p);
    const int64_t row0 = i0 + int64_t(st) * kRb;
    strip_dq(b, st, b.dq + row0 * b.ldq + int64_t(h) * b.s->D, jt, std::min(kRb, rows - st * kRb));
  }
  for (int64_t p = 0; p < jn / kW; ++p) panel_kv_grads(b, jt, p, ns);
}

// The query block of `rows` rows at i0 of head h: its packs, lse, delta and
// key ranges, then its key tiles.
void backward_block(Backward& b, int h, int64_t i0, int rows) {
  const AttnShape& s = *b.s;
  const int64_t off = i0 * b.ldq + int64_t(h) * s.D;
  pack_strips(b.q + off, b.ldq, rows, s.D, kRb, b.qs);
  pack_strips(b.dout + off, b.ldq, rows, s.D, kRb, b.dos);
  pack_row_pairs(b.q + off, b.ldq, rows, s.D, kBq / 2, kTPanel, b.qp);
  pack_row_pairs(b.dout + off, b.ldq, rows, s.D, kBq / 2, kTPanel, b.dop);
  int64_t lo = s.Tk, hi = 0;
  for (int64_t r = 0; r < kBq; ++r) {
    b.a[r] = b.b[r] = 0;
    if (r >= rows) continue;
    const int64_t o = off + r * b.ldq;
    b.lse[r] = b.lse_all[(i0 + r) * s.H + h];
    b.lse2[r] = float(double(b.lse[r]) * kLog2e_d);
    b.delta[r] = dot_bf16(b.out + o, b.dout + o, s.D);
    if (b.lse[r] != kNegInf) attn_row_keys(s, i0 + r, 0, s.Tk, &b.a[r], &b.b[r]);
    if (b.b[r] > b.a[r]) lo = std::min(lo, b.a[r]), hi = std::max(hi, b.b[r]);
  }
  for (int64_t jt = lo / kW * kW; jt < hi; jt += kBk)
    backward_tile(b, h, i0, rows, jt, std::min(kBk, round32(hi) - jt));
}

// Takes the backward's buffers from scratch.
void take_buffers(Backward& b, Scratch& scratch, int64_t kt_words, int64_t kp_words) {
  const auto take = [&](int64_t words) {
    return reinterpret_cast<uint32_t*>(scratch.take(size_t((words + 15) / 16 * 16)));
  };
  b.kt = take(kt_words), b.vt = take(kt_words), b.kp = take(kp_words);
  b.qs = take(kBq * b.Dp), b.dos = take(kBq * b.Dp);
  b.qp = take(b.Dn * kTPanel), b.dop = take(b.Dn * kTPanel);
  b.pt = take(kBk / kW * kTPanel), b.dst = take(kBk / kW * kTPanel), b.dsr = take(kBq * kLdDs);
}

#pragma GCC diagnostic pop

}  // namespace

void attention_backward_bf16(const Ctx& ctx, const AttnShape& s, const AttnBf16Grad& g) {
  check_attn_shape(s);
  TRIDENT_CHECK(bf16_units().avx512_bf16 && __builtin_cpu_supports("avx512dq"),
                "attention_backward_bf16: this CPU has no AVX512-BF16 (with AVX512-DQ)");
  Backward b;
  b.s = &s;
  b.q = g.q, b.out = g.out, b.dout = g.dout, b.lse_all = g.lse;
  b.dq = g.dq, b.dk = g.dk, b.dv = g.dv;
  b.ldq = int64_t(s.H) * s.D, b.ldkv = int64_t(s.Hkv) * s.D;
  b.Dp = pairs_of(s.D), b.Dn = panels_of(s.D);
  b.kt_panel = b.Dp * kW, b.kp_stride = round32(s.Tk) / 2 * kW;
  const int64_t kt_words = round32(s.Tk) * b.Dp, kp_words = b.Dn * b.kp_stride;
  const int64_t tile_words = 2 * (kBk / kW * kTPanel) + kBq * kLdDs;
  Scratch scratch(ctx, size_t(2 * kt_words + kp_words + 2 * kBq * b.Dp + 2 * b.Dn * kTPanel +
                              tile_words + 16 * 10));
  take_buffers(b, scratch, kt_words, kp_words);
  const int group = s.H / s.Hkv;
  for (int h = 0; h < s.H; ++h) {
    const int kv = h / group;
    if (h % group == 0) {
      pack_rows_as_columns(g.k + int64_t(kv) * s.D, b.ldkv, s.Tk, s.D, b.kt);
      pack_rows_as_columns(g.v + int64_t(kv) * s.D, b.ldkv, s.Tk, s.D, b.vt);
      pack_row_pairs(g.k + int64_t(kv) * s.D, b.ldkv, s.Tk, s.D, b.kp_stride / kW, b.kp_stride,
                     b.kp);
    }
    const int64_t kvoff = int64_t(kv) * s.D;
    b.dk = g.dk + kvoff, b.dv = g.dv + kvoff;
    for (int64_t i0 = 0; i0 < s.Tq; i0 += kBq)
      backward_block(b, h, i0, int(std::min<int64_t>(kBq, s.Tq - i0)));
  }
}

#else  // not x86-64 with GCC or Clang: no native bf16 (bf16_units() finds none)

void attention_backward_bf16(const Ctx&, const AttnShape&, const AttnBf16Grad&) {
  throw Error("attention_backward_bf16: needs an x86-64 CPU with AVX512-BF16");
}

#endif

}  // namespace trident::kernels::cpu
