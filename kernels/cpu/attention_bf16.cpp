// Attention on the native bf16 GEMM (cpu_bf16.hpp): the f32 kernel's loop
// (attention.cpp: query blocks of kQueryBlock rows, key tiles of kKeyBlock,
// each tile cut into the pieces of attention_tiles.hpp) with its products on
// gemm_bf16, as flash attention computes them on tensor cores: S = scale Q·Kᵀ
// from the bf16 Q and K with fp32 accumulation, the online softmax (running
// max, sum, the accumulator's rescaling) in fp32, P rounded to bf16 as the P·V
// GEMM packs it (the row sums add the fp32 P), acc += P·V in fp32; out =
// acc / l rounded once at the end. Q, K and V are read where they lie (the
// GEMM packs them per call), GQA through the row stride as in attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "gemm_direct.hpp"
#include "scratch.hpp"
#include "trident/kernels/attention_tiles.hpp"
#include "trident/kernels/cpu_bf16.hpp"

namespace trident::kernels::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row stride of a tile of scores: its columns rounded up to 16 floats, plus
// 16 (no power-of-two stride; attention.cpp's tile_stride).
inline int64_t score_stride(int64_t cols) { return (cols + 15) / 16 * 16 + 16; }

// The forward's per-call state: the operands, and the query block's
// scores, running (m, l) and P·V accumulator.
struct Forward {
  const AttnShape& s;
  const uint16_t *q, *k, *v;
  int64_t ldq, ldkv;  // row strides of [T, H, D] and [T, Hkv, D]
  float *scores = nullptr, *acc = nullptr, *m = nullptr, *l = nullptr;
};

// Row `row` of head h (or kv head g) of a [T, heads, D] bf16 tensor.
inline const uint16_t* at(const uint16_t* x, int64_t ld, int64_t row, int64_t head, int64_t D) {
  return x + row * ld + head * D;
}

// S = scale Q·Kᵀ over the tile's pieces: the query block at i0 of head h,
// keys from j0 (the tile's first computed column) of kv head g.
void tile_scores(const Forward& f, const AttnTile& t, int h, int g, int64_t i0, int64_t j0,
                 int64_t lds) {
  const int64_t D = f.s.D;
  for (int u = 0; u < t.n_pieces; ++u) {
    const AttnPiece& pc = t.piece[u];
    const Bf16Operand qa{at(f.q, f.ldq, i0 + pc.r0, h, D), false, false, f.ldq};
    const Bf16Operand kb{at(f.k, f.ldkv, j0 + pc.c0, g, D), false, true, f.ldkv};
    gemm_bf16(pc.r1 - pc.r0, pc.c1 - pc.c0, D, f.s.scale, qa, kb, 0.0f,
              f.scores + pc.r0 * lds + pc.c0, lds);
  }
}

// The online softmax over one tile's scores (attention.cpp's
// forward_softmax_rows): each row's new max, its rescaled sum and
// accumulator, the scores turned into exp(s - m), zero outside the row's keys.
void tile_softmax(Forward& f, const AttnTile& t, int64_t rows, int64_t lds) {
  for (int64_t i = 0; i < rows; ++i) {
    float* srow = f.scores + i * lds;
    const int64_t a = t.lo[i], n = t.n[i];
    const float m_new = std::max(f.m[i], row_max_native(srow + a, n));
    if (m_new == kNegInf) {  // nothing visible yet: the row stays empty
      attn_zero_masked(t, i, srow);
      continue;
    }
    const float alpha = f.m[i] == m_new ? 1.0f : std::exp(f.m[i] - m_new);  // exp(-inf) = 0
    f.l[i] = f.l[i] * alpha + exp_shift_sum_native(srow + a, n, m_new);
    attn_zero_masked(t, i, srow);
    if (alpha != 1.0f)
      for (int64_t d = 0; d < f.s.D; ++d) f.acc[i * f.s.D + d] *= alpha;
    f.m[i] = m_new;
  }
}

// acc += P·V over the tile's pieces (P f32, rounded to bf16 when packed).
void tile_pv(const Forward& f, const AttnTile& t, int g, int64_t j0, int64_t lds) {
  const int64_t D = f.s.D;
  for (int u = 0; u < t.n_pieces; ++u) {
    const AttnPiece& pc = t.piece[u];
    const Bf16Operand pa{f.scores + pc.r0 * lds + pc.c0, true, false, lds};
    const Bf16Operand vb{at(f.v, f.ldkv, j0 + pc.c0, g, D), false, false, f.ldkv};
    gemm_bf16(pc.r1 - pc.r0, D, pc.c1 - pc.c0, 1.0f, pa, vb, 1.0f, f.acc + pc.r0 * D, D);
  }
}

// out = acc / l (f32, or rounded to bf16) and lse = m + log l for the
// block's rows; a fully masked row: zero output, lse -inf.
void finish_rows(const Forward& f, F32OrBf16 out, float* lse, int h, int64_t i0, int64_t rows) {
  const int64_t D = f.s.D;
  for (int64_t i = 0; i < rows; ++i) {
    float* arow = f.acc + i * D;
    const float inv = f.l[i] > 0.0f ? 1.0f / f.l[i] : 0.0f;
    for (int64_t d = 0; d < D; ++d) arow[d] *= inv;
    const int64_t o = (i0 + i) * f.ldq + int64_t(h) * D;
    if (out.f32)
      std::copy_n(arow, D, static_cast<float*>(out.p) + o);
    else
      round_bf16(arow, D, static_cast<uint16_t*>(out.p) + o);
    lse[(i0 + i) * f.s.H + h] = f.l[i] > 0.0f ? f.m[i] + std::log(f.l[i]) : kNegInf;
  }
}

// The query block at i0 of head h: its key tiles, then its output rows.
void forward_block(Forward& f, F32OrBf16 out, float* lse, int h, int64_t i0) {
  const AttnShape& s = f.s;
  const int g = h / (s.H / s.Hkv);
  const int64_t rows = std::min(kQueryBlock, s.Tq - i0);
  std::fill(f.m, f.m + rows, kNegInf);
  std::fill(f.l, f.l + rows, 0.0f);
  std::fill(f.acc, f.acc + rows * s.D, 0.0f);
  AttnTile tile;
  attn_for_each_key_tile(s, i0, rows, tile, [&](const AttnTile& t, int64_t jt) {
    const int64_t j0 = jt + t.c0, lds = score_stride(t.c1 - t.c0);
    tile_scores(f, t, h, g, i0, j0, lds);
    tile_softmax(f, t, rows, lds);
    tile_pv(f, t, g, j0, lds);
  });
  finish_rows(f, out, lse, h, i0, rows);
}

// The backward's per-call state: the operands, the gradients it adds to and
// one tile's P and dP (dS in place), the query block's delta and lse.
struct Backward {
  const AttnShape& s;
  const uint16_t *q, *k, *v, *dout;
  float *dq, *dk, *dv;
  int64_t ldq, ldkv;
  float *p = nullptr, *dp = nullptr, *delta = nullptr, *row_lse = nullptr;
};

inline float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// delta of every (query, head) = rowsum(dO * O) in fp32 (summed in double).
void backward_deltas(const AttnShape& s, const uint16_t* out, const uint16_t* dout,
                     float* delta_all) {
  const int64_t n = s.Tq * s.H;
  for (int64_t r = 0; r < n; ++r) {
    double sum = 0;
    for (int64_t d = 0; d < s.D; ++d)
      sum += double(widen(out[r * s.D + d])) * double(widen(dout[r * s.D + d]));
    delta_all[r] = float(sum);
  }
}

// P = exp(scale Q·Kᵀ - lse) over one tile's pieces, zero outside each row's keys.
void tile_probs(const Backward& b, const AttnTile& t, int h, int g, int64_t i0, int64_t j0,
                int64_t lds, int64_t rows) {
  const int64_t D = b.s.D;
  for (int u = 0; u < t.n_pieces; ++u) {
    const AttnPiece& pc = t.piece[u];
    const Bf16Operand qa{at(b.q, b.ldq, i0 + pc.r0, h, D), false, false, b.ldq};
    const Bf16Operand kb{at(b.k, b.ldkv, j0 + pc.c0, g, D), false, true, b.ldkv};
    gemm_bf16(pc.r1 - pc.r0, pc.c1 - pc.c0, D, b.s.scale, qa, kb, 0.0f, b.p + pc.r0 * lds + pc.c0,
              lds);
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* prow = b.p + i * lds;
    if (b.row_lse[i] == kNegInf) {
      std::fill(prow + t.f0[i / kAttnRowBand], prow + t.f1[i / kAttnRowBand], 0.0f);
      continue;
    }
    exp_shift_sum_native(prow + t.lo[i], t.n[i], b.row_lse[i]);
    attn_zero_masked(t, i, prow);
  }
}

// dV += Pᵀ dO and dS = P (dP - delta) with dP = dO Vᵀ, over one tile's
// pieces (P and dS rounded to bf16 as the GEMMs pack them).
void tile_dv_ds(const Backward& b, const AttnTile& t, int h, int g, int64_t i0, int64_t j0,
                int64_t lds, int64_t rows) {
  const int64_t D = b.s.D;
  for (int u = 0; u < t.n_pieces; ++u) {
    const AttnPiece& pc = t.piece[u];
    const int64_t pr = pc.r1 - pc.r0, pn = pc.c1 - pc.c0, off = pc.r0 * lds + pc.c0;
    const Bf16Operand pt{b.p + off, true, true, lds};
    const Bf16Operand dob{at(b.dout, b.ldq, i0 + pc.r0, h, D), false, false, b.ldq};
    gemm_bf16(pn, D, pr, 1.0f, pt, dob, 1.0f, b.dv + (j0 + pc.c0) * b.ldkv + int64_t(g) * D,
              b.ldkv);
    const Bf16Operand vt{at(b.v, b.ldkv, j0 + pc.c0, g, D), false, true, b.ldkv};
    gemm_bf16(pr, pn, D, 1.0f, dob, vt, 0.0f, b.dp + off, lds);
  }
  for (int64_t i = 0; i < rows; ++i) {
    const float* prow = b.p + i * lds;
    float* dprow = b.dp + i * lds;
    for (int64_t j = t.lo[i]; j < t.lo[i] + t.n[i]; ++j)
      dprow[j] = prow[j] * (dprow[j] - b.delta[i]);
    attn_zero_masked(t, i, dprow);
  }
}

// dQ += scale dS K and dK += scale dSᵀ Q over one tile's pieces.
void tile_dq_dk(const Backward& b, const AttnTile& t, int h, int g, int64_t i0, int64_t j0,
                int64_t lds) {
  const int64_t D = b.s.D;
  for (int u = 0; u < t.n_pieces; ++u) {
    const AttnPiece& pc = t.piece[u];
    const int64_t pr = pc.r1 - pc.r0, pn = pc.c1 - pc.c0, off = pc.r0 * lds + pc.c0;
    const Bf16Operand ds{b.dp + off, true, false, lds}, dst{b.dp + off, true, true, lds};
    const Bf16Operand kb{at(b.k, b.ldkv, j0 + pc.c0, g, D), false, false, b.ldkv};
    const Bf16Operand qb{at(b.q, b.ldq, i0 + pc.r0, h, D), false, false, b.ldq};
    gemm_bf16(pr, D, pn, b.s.scale, ds, kb, 1.0f, b.dq + (i0 + pc.r0) * b.ldq + int64_t(h) * D,
              b.ldq);
    gemm_bf16(pn, D, pr, b.s.scale, dst, qb, 1.0f, b.dk + (j0 + pc.c0) * b.ldkv + int64_t(g) * D,
              b.ldkv);
  }
}

// The query block at i0 of head h: its delta and lse, then its key tiles.
void backward_block(Backward& b, const float* delta_all, const float* lse, int h, int64_t i0) {
  const AttnShape& s = b.s;
  const int g = h / (s.H / s.Hkv);
  const int64_t rows = std::min(kQueryBlock, s.Tq - i0);
  for (int64_t i = 0; i < rows; ++i) {
    b.delta[i] = delta_all[(i0 + i) * s.H + h];
    b.row_lse[i] = lse[(i0 + i) * s.H + h];
  }
  AttnTile tile;
  attn_for_each_key_tile(s, i0, rows, tile, [&](const AttnTile& t, int64_t jt) {
    const int64_t j0 = jt + t.c0, lds = score_stride(t.c1 - t.c0);
    tile_probs(b, t, h, g, i0, j0, lds, rows);
    tile_dv_ds(b, t, h, g, i0, j0, lds, rows);
    tile_dq_dk(b, t, h, g, i0, j0, lds);
  });
}

}  // namespace

void attention_forward_bf16(const Ctx& ctx, const AttnShape& s, const uint16_t* q,
                            const uint16_t* k, const uint16_t* v, F32OrBf16 out, float* lse) {
  check_attn_shape(s);
  Scratch scratch(ctx, size_t(kQueryBlock * (score_stride(kKeyBlock) + s.D + 2)));
  Forward f{s, q, k, v, int64_t(s.H) * s.D, int64_t(s.Hkv) * s.D};
  f.scores = scratch.take(size_t(kQueryBlock * score_stride(kKeyBlock)));
  f.acc = scratch.take(size_t(kQueryBlock * s.D));
  f.m = scratch.take(kQueryBlock);
  f.l = scratch.take(kQueryBlock);
  for (int h = 0; h < s.H; ++h)
    for (int64_t i0 = 0; i0 < s.Tq; i0 += kQueryBlock) forward_block(f, out, lse, h, i0);
}

void attention_backward_bf16(const Ctx& ctx, const AttnShape& s, const AttnBf16Grad& a) {
  check_attn_shape(s);
  const size_t tile = size_t(kQueryBlock * score_stride(kKeyBlock));
  Scratch scratch(ctx, 2 * tile + 2 * size_t(kQueryBlock) + size_t(s.Tq * s.H));
  Backward b{s, a.q, a.k, a.v, a.dout, a.dq, a.dk, a.dv, int64_t(s.H) * s.D, int64_t(s.Hkv) * s.D};
  b.p = scratch.take(tile);
  b.dp = scratch.take(tile);
  b.delta = scratch.take(kQueryBlock);
  b.row_lse = scratch.take(kQueryBlock);
  float* delta_all = scratch.take(size_t(s.Tq * s.H));
  backward_deltas(s, a.out, a.dout, delta_all);
  for (int h = 0; h < s.H; ++h)
    for (int64_t i0 = 0; i0 < s.Tq; i0 += kQueryBlock) backward_block(b, delta_all, a.lse, h, i0);
}

}  // namespace trident::kernels::cpu
