// How the CPU attention kernel cuts one (query block x key tile) into GEMMs:
// the plan kernels/cpu/attention.cpp computes per tile, and the one the
// document-balanced cp layout's cost model counts (parallel/cp), so that the
// model prices exactly the pairs, pieces and rows the kernel computes.
// Host only; integers only (no effect on any floating-point result), but for
// attn_zero_masked, which writes zeros.
//
// A tile whose rows see very different key ranges (the causal diagonal, a
// window's edge, a document boundary) is cut into pieces so that the GEMMs
// skip most masked pairs: the columns every row band of kAttnRowBand rows
// needs go to one GEMM over all rows, each band's remaining columns to a
// GEMM of its own. A 256 x 256 causal diagonal then computes 36,864 pairs
// instead of 65,536 (32,896 are visible).
#pragma once

#include <algorithm>
#include <cstdint>

#include "trident/kernels/types/attention.hpp"

namespace trident::kernels {

// Rows of one band of a cut tile: small enough that a diagonal's bands leave
// little masked, large enough for an efficient GEMM.
inline constexpr int64_t kAttnRowBand = 32;
inline constexpr int64_t kAttnBands = (kQueryBlock + kAttnRowBand - 1) / kAttnRowBand;
inline constexpr int64_t kAttnMaxPieces = 1 + 2 * kAttnBands;

// A block of a tile that one GEMM covers: rows [r0, r1) of the query block,
// columns [c0, c1) relative to the tile's first computed column.
struct AttnPiece {
  int64_t r0, r1, c0, c1;
};

// One key tile as the rows of a query block see it: the columns [c0, c1) of
// the tile [j0, j0 + cols) that any row sees (the GEMMs cover only those),
// per row its visible keys [lo, lo + n) relative to c0, and the GEMM pieces.
// Without documents and window, c0 = 0 and a row sees the prefix up to the
// causal diagonal.
struct AttnTile {
  int64_t c0 = 0, c1 = 0;
  int64_t lo[kQueryBlock], n[kQueryBlock];
  int n_pieces = 0;
  AttnPiece piece[kAttnMaxPieces];
  // Per band of kAttnRowBand rows, the columns [f0, f1) its pieces compute:
  // the part of its rows the later GEMMs read, so the part the row passes set.
  int64_t f0[kAttnBands + 1], f1[kAttnBands + 1];
  bool empty() const { return c1 <= c0; }
};

// The GEMM pieces of a non-empty tile: the whole (rows x columns) block, or,
// when that would compute more than 1/8 of its pairs in vain and bands save
// that, the columns common to every band's key range over all rows plus
// each band's columns on either side of them.
inline void attn_plan_tile(int64_t rows, AttnTile* t) {
  const int64_t cols = t->c1 - t->c0;
  int64_t u0[kAttnBands + 1], u1[kAttnBands + 1];
  const int64_t bands = (rows + kAttnRowBand - 1) / kAttnRowBand;
  int64_t common0 = 0, common1 = cols;
  for (int64_t b = 0; b < bands; ++b) {
    u0[b] = cols;
    u1[b] = 0;
    for (int64_t i = b * kAttnRowBand; i < std::min(rows, (b + 1) * kAttnRowBand); ++i)
      if (t->n[i] > 0) {
        u0[b] = std::min(u0[b], t->lo[i]);
        u1[b] = std::max(u1[b], t->lo[i] + t->n[i]);
      }
    if (u1[b] > u0[b]) {
      common0 = std::max(common0, u0[b]);
      common1 = std::min(common1, u1[b]);
    }
  }
  const bool has_common = common1 > common0;
  int64_t split = has_common ? rows * (common1 - common0) : 0;
  for (int64_t b = 0; b < bands; ++b) {
    if (u1[b] <= u0[b]) continue;
    const int64_t band_rows = std::min(rows, (b + 1) * kAttnRowBand) - b * kAttnRowBand;
    split += band_rows * (has_common ? (common0 - u0[b]) + (u1[b] - common1) : u1[b] - u0[b]);
  }
  t->n_pieces = 0;
  if (bands < 2 || 8 * split > 7 * rows * cols) {
    t->piece[t->n_pieces++] = AttnPiece{0, rows, 0, cols};
    for (int64_t b = 0; b < bands; ++b) {
      t->f0[b] = 0;
      t->f1[b] = cols;
    }
    return;
  }
  if (has_common) t->piece[t->n_pieces++] = AttnPiece{0, rows, common0, common1};
  for (int64_t b = 0; b < bands; ++b) {
    const int64_t r0 = b * kAttnRowBand, r1 = std::min(rows, (b + 1) * kAttnRowBand);
    t->f0[b] = has_common ? common0 : 0;
    t->f1[b] = has_common ? common1 : 0;
    if (u1[b] <= u0[b]) continue;
    t->f0[b] = has_common ? std::min(u0[b], common0) : u0[b];
    t->f1[b] = has_common ? std::max(u1[b], common1) : u1[b];
    if (!has_common) {
      t->piece[t->n_pieces++] = AttnPiece{r0, r1, u0[b], u1[b]};
      continue;
    }
    if (u0[b] < common0) t->piece[t->n_pieces++] = AttnPiece{r0, r1, u0[b], common0};
    if (common1 < u1[b]) t->piece[t->n_pieces++] = AttnPiece{r0, r1, common1, u1[b]};
  }
}

// The tile [j0, j0 + cols) of the query block [i0, i0 + rows) of shape s:
// row intervals, computed columns and pieces (none when no row sees a key).
inline void attn_view_tile(const AttnShape& s, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                           AttnTile* t) {
  t->c0 = cols;
  t->c1 = 0;
  t->n_pieces = 0;
  for (int64_t i = 0; i < rows; ++i) {
    int64_t a, b;
    attn_row_keys(s, i0 + i, j0, cols, &a, &b);
    t->lo[i] = a;
    t->n[i] = b - a;
    if (b > a) {
      t->c0 = std::min(t->c0, a);
      t->c1 = std::max(t->c1, b);
    }
  }
  if (t->empty()) return;
  for (int64_t i = 0; i < rows; ++i) t->lo[i] = t->n[i] > 0 ? t->lo[i] - t->c0 : 0;
  attn_plan_tile(rows, t);
}

// visit(tile, jt) for each key tile [jt, jt + kKeyBlock) of the query block
// [i0, i0 + rows) that some row sees: attn_key_range's span, a tile no row
// sees skipped (no arithmetic). `tile` is the caller's (it is large).
template <class Visit>
inline void attn_for_each_key_tile(const AttnShape& s, int64_t i0, int64_t rows, AttnTile& tile,
                                   Visit&& visit) {
  int64_t jb, je;
  attn_key_range(s, i0, rows, &jb, &je);
  for (int64_t jt = jb; jt < je; jt += kKeyBlock) {
    attn_view_tile(s, i0, rows, jt, std::min(kKeyBlock, je - jt), &tile);
    if (!tile.empty()) visit(tile, jt);
  }
}

// Sets the columns of row i of a tile's scores that its band's pieces
// compute, except the row's visible keys [lo, lo + n), to 0 (the CPU kernels'
// P and dS before their GEMMs read them).
inline void attn_zero_masked(const AttnTile& t, int64_t i, float* row) {
  const int64_t b = i / kAttnRowBand, a = t.lo[i], n = t.n[i];
  if (n == 0) {
    std::fill(row + t.f0[b], row + t.f1[b], 0.0f);
    return;
  }
  std::fill(row + t.f0[b], row + a, 0.0f);
  std::fill(row + a + n, row + t.f1[b], 0.0f);
}

}  // namespace trident::kernels
