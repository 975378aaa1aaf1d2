// The shape of an attention call (AttnShape), the mask rules the kernels,
// the reference and the pair counts share, the kernels' tile sizes, and the
// host-side counts of a shape (visible pairs, FLOPs, scratch bytes). Plain
// types and host arithmetic, no kernel: part of the public op API
// (functional.hpp's attention ops take an AttnShape; the ring, the cp layout
// and the planner count with it). The kernels are in kernels/attention.hpp;
// the layouts of q, k, v, out and lse there.
//
// Masking: with causal, query i may see key j iff k_pos0 + j <= q_pos0 + i
// (global sequence positions; the local tokens passed in one call are one
// contiguous run of positions). Per tile the mask is full, diagonal (checked
// element by element, the tile's columns cut after the last key any of its
// queries sees) or the tile is skipped without any arithmetic.
//
// Packed documents and sliding windows (both off by default, and then the
// kernels do exactly the arithmetic described above): with q_doc / k_doc, key
// j is visible to query i only if they belong to the same document
// (q_doc[i] == k_doc[j]); with window W > 0 only if (q_pos0 + i) - (k_pos0 + j)
// < W. Both combine with the causal rule. Document ids are non-decreasing
// within one call (one call's tokens are one contiguous run of positions), so
// the keys a row sees form one interval: per query block the key range is cut
// to the documents and window of its first and last query, per tile every
// row's interval is found, a tile no row sees is skipped and the GEMMs of the
// others cover only the union of the row intervals (masked element-wise
// inside). A row that sees no key at all gets lse = -inf and a zero output.
#pragma once
#include <cstddef>
#include <cstdint>

#include "trident/kernels/host_device.hpp"

namespace trident::kernels {

struct AttnShape {
  int64_t Tq = 0, Tk = 0;  // query and key tokens in this call
  int H = 1, Hkv = 1, D = 1;
  float scale = 1.0f;  // usually 1/sqrt(D)
  bool causal = false;
  int64_t q_pos0 = 0, k_pos0 = 0;  // global position of the first query / key
  // Document of every query [Tq] / key [Tk] (0-based within the sequence,
  // non-decreasing within the call), in the memory of the call's device like
  // q and k; both null: one document. Set both or neither.
  const int32_t* q_doc = nullptr;
  const int32_t* k_doc = nullptr;
  int64_t window = 0;  // > 0: a query sees keys less than `window` positions back
  TRIDENT_HD bool documents() const { return q_doc != nullptr; }
};

// The mask of one (query, key) pair: the rule the kernels, the reference and
// the pair counts share. qd/kd are the pair's documents (ignored when the
// shape has none).
TRIDENT_HD inline bool attn_pair_visible(const AttnShape& s, int64_t qpos, int64_t kpos, int32_t qd,
                                         int32_t kd) {
  if (s.causal && kpos > qpos) return false;
  if (s.window > 0 && qpos - kpos >= s.window) return false;
  return !s.documents() || qd == kd;
}

// The first index in [b, e) of the non-decreasing d with d[index] >= x
// (upper: > x); e if there is none.
TRIDENT_HD inline int64_t attn_doc_bound(const int32_t* d, int64_t b, int64_t e, int32_t x,
                                         bool upper) {
  while (b < e) {
    const int64_t mid = b + (e - b) / 2;
    if (upper ? d[mid] <= x : d[mid] < x)
      b = mid + 1;
    else
      e = mid;
  }
  return b;
}

// The keys [*lo, *hi) of the tile [j0, j0 + cols) that query i sees, relative
// to j0 (*lo == *hi: none). One interval: causal and window bound the
// positions, and the query's document is one run of the non-decreasing k_doc.
TRIDENT_HD inline void attn_row_keys(const AttnShape& s, int64_t i, int64_t j0, int64_t cols,
                                     int64_t* lo, int64_t* hi) {
  const int64_t qpos = s.q_pos0 + i, kpos = s.k_pos0 + j0;
  int64_t a = 0, b = cols;
  if (s.causal && qpos - kpos + 1 < b) b = qpos - kpos + 1;
  if (s.window > 0 && qpos - s.window + 1 - kpos > a) a = qpos - s.window + 1 - kpos;
  if (s.documents() && a < b) {
    const int32_t qd = s.q_doc[i];
    const int64_t first = attn_doc_bound(s.k_doc, j0 + a, j0 + b, qd, false);
    b = attn_doc_bound(s.k_doc, first, j0 + b, qd, true) - j0;
    a = first - j0;
  }
  *lo = a;
  *hi = b > a ? b : a;
}

// The keys [*jb, *je) any query of the block [i0, i0 + rows) can see (rows >
// 0): the causal end of its last query, the window start of its first, and
// the documents from its first query's to its last's.
TRIDENT_HD inline void attn_key_range(const AttnShape& s, int64_t i0, int64_t rows, int64_t* jb,
                                      int64_t* je) {
  int64_t b = 0, e = s.Tk;
  const int64_t q_first = s.q_pos0 + i0, q_last = q_first + rows - 1;
  if (s.causal && q_last - s.k_pos0 + 1 < e) e = q_last - s.k_pos0 + 1;
  if (s.window > 0 && q_first - s.window + 1 - s.k_pos0 > b) b = q_first - s.window + 1 - s.k_pos0;
  if (s.documents() && b < e) {
    b = attn_doc_bound(s.k_doc, b, e, s.q_doc[i0], false);
    e = attn_doc_bound(s.k_doc, b, e, s.q_doc[i0 + rows - 1], true);
  }
  *jb = b;
  *je = e > b ? e : b;
}

// The queries [*ib, *ie) that can see any key of the block [j0, j0 + keys)
// (keys > 0): the mirror of attn_key_range.
TRIDENT_HD inline void attn_query_range(const AttnShape& s, int64_t j0, int64_t keys, int64_t* ib,
                                        int64_t* ie) {
  int64_t b = 0, e = s.Tq;
  const int64_t k_first = s.k_pos0 + j0, k_last = k_first + keys - 1;
  if (s.causal && k_first - s.q_pos0 > b) b = k_first - s.q_pos0;
  if (s.window > 0 && k_last + s.window - s.q_pos0 < e) e = k_last + s.window - s.q_pos0;
  if (s.documents() && b < e) {
    b = attn_doc_bound(s.q_doc, b, e, s.k_doc[j0], false);
    e = attn_doc_bound(s.q_doc, b, e, s.k_doc[j0 + keys - 1], true);
  }
  *ib = b;
  *ie = e > b ? e : b;
}

// Tile sizes (rows of queries, rows of keys). Not a tuning knob for callers;
// exposed so that the ring can cut its calls at the kernel's query blocks,
// the document layout can count the kernel's tiles, and tests can pick
// sequence lengths with odd remainders.
inline constexpr int64_t kQueryBlock = 256;
inline constexpr int64_t kKeyBlock = 512;

// Throws trident::Error if the shape is inconsistent (H % Hkv, sizes < 0, one
// of q_doc / k_doc without the other, window < 0).
void check_attn_shape(const AttnShape& s);

// Number of (query, key) pairs the mask lets through, summed over heads.
// Host function: q_doc / k_doc must be host memory here (on a device, pass a
// shape whose doc pointers are host copies).
int64_t attention_visible_pairs(const AttnShape& s);

// FLOPs of the useful work (masked-out pairs not counted): forward 4*D per
// visible pair (QK^T and PV); backward 10*D per pair (recomputing QK^T, dP =
// dO V^T, dV, dQ, dK), the usual flash-attention accounting.
double attention_flops(const AttnShape& s, bool backward);

// Bytes of scratch memory one call allocates (tiles, row statistics, and the
// call's K (backward: K and V) of one kv head transposed, D x Tk floats each;
// the backward also holds delta of every query and head, Tq x H floats).
size_t attention_workspace_bytes(const AttnShape& s, bool backward);

}  // namespace trident::kernels
