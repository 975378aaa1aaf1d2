// Attention's forward on AVX512-BF16 (cpu_bf16.hpp), as flash attention
// computes it on tensor cores: S = scale Q·Kᵀ from the bf16 Q and K with fp32
// accumulation, the online softmax (running max, sum, the accumulator's
// rescaling) in fp32, P rounded to bf16 for P·V (the row sums add the fp32
// P), acc += P·V in fp32; out = acc / l rounded once at the end.
//
// K (as Kᵀ's panels) and V (in key pairs) are packed once per kv head
// (attention_bf16_tile.hpp), GQA's query heads reading their kv head's
// packs. The queries go in strips of kR rows, the register tile's height:
// per chunk of up to kChunk keys, the strip's scores (kR x 32 tiles, masked
// to -inf outside each row's keys as they are stored, each row's max taken
// on the way), then per row its exponentials, sum and P in bf16, then
// P·V: 37 KiB of scores and P, read back from the first- and second-level
// caches (256 keys per chunk measured 3-6% slower at head_dim 32 on Zen 4).
// The backward is attention_bf16_backward.cpp.
#include <algorithm>
#include <cmath>
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
constexpr double kLn2 = 0.693147180559945309;
constexpr int kR = 12;                     // query rows of a strip (the register tile's)
constexpr int64_t kChunk = 512;            // keys per step of the online softmax
constexpr int64_t kLdS = kChunk + 16;      // row stride of the strip's scores (floats)
constexpr int kLdP = int(kChunk / 2 + 8);  // row stride of the strip's P (words)

// The forward's state: the shape, the kv head's packs, the strip's packed
// queries, scores, P, accumulator, running (m, l) and keys [a, b) per row.
struct Forward {
  const AttnShape* s = nullptr;
  int64_t ldq = 0, ldkv = 0, Dp = 0, Dn = 0;
  int64_t kt_panel = 0, v_stride = 0;  // words per key panel of Kᵀ; per D panel of V
  uint32_t *kt = nullptr, *vp = nullptr, *qs = nullptr, *P = nullptr;
  float *S = nullptr, *acc = nullptr;
  float m[kR] = {}, l[kR] = {};
  int64_t a[kR] = {}, b[kR] = {};
  int64_t fa = 0, fb = 0;             // the keys every row of the strip sees
  int64_t lo = 0, hi = 0;             // the keys some row of the strip sees
  alignas(64) float mx[kR][16] = {};  // per row, lane-wise max of the chunk's scores
};

// S = scale log2(e) Q·Kᵀ (log2 units) for the strip and the keys [c0, c1)
// (whole panels), -inf outside each row's keys, and each row's lane-wise
// max of them (mx) as they are stored. A panel's half that no row sees
// (past the causal diagonal, before a window) is not computed: its scores
// are -inf as the mask makes them.
TRIDENT_ATTN_TARGET void strip_scores(Forward& f, int64_t c0, int64_t c1) {
  const __m512 sc = _mm512_set1_ps(f.s->scale * kLog2e), ninf = _mm512_set1_ps(kNegInf);
  float* const S = f.S;
  for (int r = 0; r < kR; ++r) _mm512_store_ps(f.mx[r], ninf);
  for (int64_t j = c0; j < c1; j += kW) {
    const bool full = f.fa <= j && j + kW <= f.fb;  // no row masks a key of the panel
    __m512 acc[kR][2];
    zero_tile(acc);
    dot_tile_half<kR, 1>(panel_half(f.lo, f.hi, j), f.qs, kR, f.kt + (j / kW) * f.kt_panel, f.Dp,
                         acc);
#pragma GCC unroll 12
    for (int r = 0; r < kR; ++r) {  // unrolled: the accumulators stay in registers
      const uint32_t mk = full ? ~0u : col_mask(f.a[r], f.b[r], j);
      float* srow = S + r * kLdS + (j - c0);
      const __m512 s0 = _mm512_mask_mul_ps(ninf, __mmask16(mk), acc[r][0], sc);
      const __m512 s1 = _mm512_mask_mul_ps(ninf, __mmask16(mk >> 16), acc[r][1], sc);
      _mm512_storeu_ps(srow, s0);
      _mm512_storeu_ps(srow + 16, s1);
      _mm512_store_ps(f.mx[r], _mm512_max_ps(_mm512_load_ps(f.mx[r]), _mm512_max_ps(s0, s1)));
    }
  }
}

// Row r's step of the online softmax over n scores (a multiple of 32, log2
// units): its new max, P = 2^(s - m) rounded to bf16 into its P row, its sum
// rescaled and added to, its accumulator rescaled (not when the max stayed).
TRIDENT_ATTN_TARGET void row_softmax(Forward& f, int r, int64_t n) {
  const float* srow = f.S + r * kLdS;
  uint32_t* prow = f.P + r * kLdP;
  const float m_new = std::max(f.m[r], _mm512_reduce_max_ps(_mm512_load_ps(f.mx[r])));
  if (m_new == kNegInf) {  // nothing visible yet: the row stays empty
    std::fill(prow, prow + n / 2, 0u);
    return;
  }
  const float alpha = f.m[r] == m_new ? 1.0f : std::exp2(f.m[r] - m_new);  // 2^-inf = 0
  const __m512 mv = _mm512_set1_ps(m_new);
  __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += kW) {
    const __m512 e0 = exp2_fast(_mm512_sub_ps(_mm512_loadu_ps(srow + j), mv));
    const __m512 e1 = exp2_fast(_mm512_sub_ps(_mm512_loadu_ps(srow + j + 16), mv));
    sum0 = _mm512_add_ps(sum0, e0);
    sum1 = _mm512_add_ps(sum1, e1);
    _mm512_storeu_si512(prow + j / 2, bf16_row(e0, e1));
  }
  f.l[r] = f.l[r] * alpha + _mm512_reduce_add_ps(_mm512_add_ps(sum0, sum1));
  if (alpha != 1.0f && f.m[r] != kNegInf) {  // the first step: the accumulator is zero
    float* arow = f.acc + r * f.Dn * kW;
    const __m512 av = _mm512_set1_ps(alpha);
    for (int64_t d = 0; d < f.Dn * kW; d += 16)
      _mm512_storeu_ps(arow + d, _mm512_mul_ps(av, _mm512_loadu_ps(arow + d)));
  }
  f.m[r] = m_new;
}

// acc += P·V for the strip's P over the keys [c0, c1), from the key pair
// of the strip's first key to that of its last (P is 0 outside: the pairs
// skipped would add only zeros).
TRIDENT_ATTN_TARGET void strip_pv(Forward& f, int64_t c0, int64_t c1) {
  const int64_t p0 = (std::max(c0, f.lo) - c0) / 2, p1 = (std::min(c1, f.hi) - c0 + 1) / 2;
  for (int64_t dn = 0; dn < f.Dn; ++dn) {
    __m512 acc[kR][2];
    zero_tile(acc);
    dot_tile<kR, kLdP>(f.P + p0, 1, f.vp + dn * f.v_stride + (c0 / 2 + p0) * kW, p1 - p0, acc);
    add_tile(acc, f.acc + dn * kW, f.Dn * kW, kR, kW, 1.0f);
  }
}

// out = acc / l (f32, or rounded to bf16) and lse = m ln 2 + log l (m in
// log2 units) for the strip's rows; a fully masked row: zero output, lse -inf.
void finish_strip(Forward& f, F32OrBf16 out, float* lse, int h, int64_t i0, int rows) {
  const int64_t D = f.s->D;
  for (int r = 0; r < rows; ++r) {
    float* arow = f.acc + r * f.Dn * kW;
    const float inv = f.l[r] > 0.0f ? 1.0f / f.l[r] : 0.0f;
    for (int64_t d = 0; d < D; ++d) arow[d] *= inv;
    const int64_t o = (i0 + r) * f.ldq + int64_t(h) * D;
    if (out.f32)
      std::copy_n(arow, D, static_cast<float*>(out.p) + o);
    else
      round_bf16(arow, D, static_cast<uint16_t*>(out.p) + o);
    lse[(i0 + r) * f.s->H + h] =
        f.l[r] > 0.0f ? float(double(f.m[r]) * kLn2 + std::log(double(f.l[r]))) : kNegInf;
  }
}

// The strip of `rows` queries at i0 of head h (q at its first row): its
// keys, then its chunks, then its output rows.
void forward_strip(Forward& f, const uint16_t* q, F32OrBf16 out, float* lse, int h, int64_t i0,
                   int rows) {
  const AttnShape& s = *f.s;
  pack_strips(q, f.ldq, rows, s.D, kR, f.qs);
  if (i0 + kR < s.Tq)  // the next strip's rows, while this one computes
    prefetch_rows(q + kR * f.ldq, f.ldq, std::min<int64_t>(kR, s.Tq - i0 - kR), s.D);
  int64_t lo = s.Tk, hi = 0;
  f.fa = 0, f.fb = s.Tk;
  for (int r = 0; r < kR; ++r) {
    f.a[r] = f.b[r] = 0;
    if (r < rows) attn_row_keys(s, i0 + r, 0, s.Tk, &f.a[r], &f.b[r]);
    if (f.b[r] > f.a[r]) lo = std::min(lo, f.a[r]), hi = std::max(hi, f.b[r]);
    f.fa = std::max(f.fa, f.a[r]), f.fb = std::min(f.fb, f.b[r]);
    f.m[r] = kNegInf;
    f.l[r] = 0.0f;
  }
  std::fill(f.acc, f.acc + kR * f.Dn * kW, 0.0f);
  f.lo = lo, f.hi = hi;
  for (int64_t c0 = lo / kW * kW; c0 < hi; c0 += kChunk) {
    const int64_t c1 = std::min(c0 + kChunk, round32(hi));
    strip_scores(f, c0, c1);
    for (int r = 0; r < kR; ++r) row_softmax(f, r, c1 - c0);
    strip_pv(f, c0, c1);
  }
  finish_strip(f, out, lse, h, i0, rows);
}

#pragma GCC diagnostic pop

}  // namespace

void attention_forward_bf16(const Ctx& ctx, const AttnShape& s, const uint16_t* q,
                            const uint16_t* k, const uint16_t* v, F32OrBf16 out, float* lse) {
  check_attn_shape(s);
  TRIDENT_CHECK(bf16_units().avx512_bf16 && __builtin_cpu_supports("avx512dq"),
                "attention_forward_bf16: this CPU has no AVX512-BF16 (with AVX512-DQ)");
  Forward f;
  f.s = &s;
  f.ldq = int64_t(s.H) * s.D, f.ldkv = int64_t(s.Hkv) * s.D;
  f.Dp = pairs_of(s.D), f.Dn = panels_of(s.D);
  f.kt_panel = f.Dp * kW, f.v_stride = round32(s.Tk) / 2 * kW;
  const int64_t kt_words = round32(s.Tk) * f.Dp, v_words = f.Dn * f.v_stride;
  const auto up16 = [](int64_t n) { return size_t((n + 15) / 16 * 16); };
  Scratch scratch(ctx, up16(kt_words) + up16(v_words) + up16(f.Dp * kR) + up16(kR * kLdP) +
                           up16(kR * kLdS) + up16(kR * f.Dn * kW));
  f.kt = reinterpret_cast<uint32_t*>(scratch.take(up16(kt_words)));
  f.vp = reinterpret_cast<uint32_t*>(scratch.take(up16(v_words)));
  f.qs = reinterpret_cast<uint32_t*>(scratch.take(up16(f.Dp * kR)));
  f.P = reinterpret_cast<uint32_t*>(scratch.take(up16(kR * kLdP)));
  f.S = scratch.take(up16(kR * kLdS));
  f.acc = scratch.take(up16(kR * f.Dn * kW));
  const int group = s.H / s.Hkv;
  for (int h = 0; h < s.H; ++h) {
    const int g = h / group;
    if (h % group == 0) {
      pack_rows_as_columns(k + int64_t(g) * s.D, f.ldkv, s.Tk, s.D, f.kt);
      pack_row_pairs(v + int64_t(g) * s.D, f.ldkv, s.Tk, s.D, f.v_stride / kW, f.v_stride, f.vp);
    }
    for (int64_t i0 = 0; i0 < s.Tq; i0 += kR)
      forward_strip(f, q + i0 * f.ldq + int64_t(h) * s.D, out, lse, h, i0,
                    int(std::min<int64_t>(kR, s.Tq - i0)));
  }
}

#else  // not x86-64 with GCC or Clang: no native bf16 (bf16_units() finds none)

void attention_forward_bf16(const Ctx&, const AttnShape&, const uint16_t*, const uint16_t*,
                            const uint16_t*, F32OrBf16, float*) {
  throw Error("attention_forward_bf16: needs an x86-64 CPU with AVX512-BF16");
}

#endif

}  // namespace trident::kernels::cpu
