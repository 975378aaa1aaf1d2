// The native bf16 GEMM of the CPU (cpu_bf16.hpp): AVX512-BF16's vdpbf16ps
// multiplies a pair of bf16 values by a pair and adds both products to one
// fp32 lane, so the operands are packed K-pair-interleaved: a 32-bit word
// holds (x[k], x[k + 1]) of one row of op(A) or one column of op(B).
//
// Blocking (GotoBLAS's order): K in blocks of kKcPairs pairs; per K block
// all of op(B) is packed into panels of 32 columns (one panel's K block is
// 32 KiB, read by every row tile of a row block in turn), and op(A) in
// blocks of kMc rows packed into panels of kMr rows (96 KiB, the
// second-level cache). Block sizes measured on a Zen 4 core (2026-12-05,
// 128 or 256 pairs by 96, 192 or 384 rows, the model's shapes): 256 x 96
// was the fastest or level with the fastest on every shape. The register tile is kMr x 32 of C: 24
// accumulators, two B vectors, one broadcast pair of A. Each element of C is the fp32 sum of its K
// block's pair products, added to C block by block: fp32 accumulation throughout, in another order
// than the staged path's sgemm.
//
// Packing (AVX-512): a source whose k is contiguous is transposed sixteen
// pairs by sixteen rows at a time, a k-major one interleaves two rows sixteen
// values at a time, reading every row once per K block; an f32 operand is
// rounded to bf16 (nearest even, as round_to_bf16) as it is loaded, with no
// separate rounding pass or bf16 copy of it (vcvtne2ps2bf16, a denormal as
// round_to_bf16 rounds it: bf16_vector.hpp). A bf16 C of one K block is
// rounded by the tiles as they store it; each tile prefetches its C lines.
#include "trident/kernels/types/gemm_bf16.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "bf16_round.hpp"
#include "bf16_vector.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/cpu_bf16.hpp"

namespace trident::kernels::cpu {

#ifdef TRIDENT_BF16_NATIVE
namespace {

// GCC 12's AVX-512 intrinsics (broadcasts, shifts) start from an "undefined"
// register that -W(maybe-)uninitialized reports when they are inlined; every
// lane of their results is defined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

constexpr int kMr = 12;            // rows of the register tile
constexpr int kNr = 32;            // columns of the register tile (two vectors)
constexpr int64_t kKcPairs = 256;  // K block, in pairs (512 values of k)
constexpr int64_t kMc = 8 * kMr;   // rows of op(A) per packed block
// (gemm_bf16_buffer_bytes, at the end, sizes the buffers with these four.)

// The packing of one operand, bf16 or f32 (rounded to bf16 as it is
// packed): `outer` is the index of op(A)'s rows or op(B)'s columns (the
// panel's width), k the depth. k_major: element (outer, k) at p[k * ld +
// outer], else at p[outer * ld + k].
struct PackSource {
  const void* p;
  int64_t ld;
  bool f32;
  bool k_major;
  int64_t K;
};

uint32_t value_at(const PackSource& s, int64_t outer, int64_t k) {
  if (k >= s.K) return 0;
  const int64_t i = s.k_major ? k * s.ld + outer : outer * s.ld + k;
  if (s.f32) return round_to_bf16(static_cast<const float*>(s.p)[i]);
  return static_cast<const uint16_t*>(s.p)[i];
}

using vec::round32;

uint32_t pair_at(const PackSource& s, int64_t outer, int64_t k) {
  return value_at(s, outer, k) | (value_at(s, outer, k + 1) << 16);
}

__mmask16 lanes(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// n <= 16 values of two rows of a k-major source (from elements i and i +
// ld) as the low and the high sixteen bf16, zero past n.
TRIDENT_BF16_TARGET inline __m512i load_rows(const PackSource& s, int64_t i, int64_t n) {
  const float* x = static_cast<const float*>(s.p) + i;
  const uint16_t* y = static_cast<const uint16_t*>(s.p) + i;
  if (n >= 16) {  // unmasked where it can (masked memory operations are slower on Zen 4)
    if (s.f32) return round32(_mm512_loadu_ps(x), _mm512_loadu_ps(x + s.ld));
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y));
    const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + s.ld));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  if (s.f32)
    return round32(_mm512_maskz_loadu_ps(lanes(n), x), _mm512_maskz_loadu_ps(lanes(n), x + s.ld));
  const __m256i lo = _mm256_maskz_loadu_epi16(lanes(n), y);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                            _mm256_maskz_loadu_epi16(lanes(n), y + s.ld), 1);
}

// The words (v[j], v[16 + j]) of 32 bf16: two rows' values interleaved.
TRIDENT_BF16_TARGET inline __m512i interleave(__m512i v) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, v);
}

// Words [0, n) of v to d (n <= 16).
TRIDENT_BF16_TARGET inline void store16(uint32_t* d, int64_t n, __m512i v) {
  if (n >= 16)
    _mm512_storeu_si512(d, v);
  else
    _mm512_mask_storeu_epi32(d, lanes(n), v);
}

// n <= 16 words (pairs) from element i of a row whose k is contiguous: word
// j = (x[i + 2j], x[i + 2j + 1]); zero past n.
TRIDENT_BF16_TARGET inline __m512i load_pairs(const PackSource& s, int64_t i, int64_t n) {
  const float* x = static_cast<const float*>(s.p) + i;
  const uint16_t* y = static_cast<const uint16_t*>(s.p) + i;
  if (!s.f32) return n >= 16 ? _mm512_loadu_si512(y) : _mm512_maskz_loadu_epi32(lanes(n), y);
  if (n >= 16) return round32(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16));
  return round32(_mm512_maskz_loadu_ps(lanes(2 * n), x),
                 _mm512_maskz_loadu_ps(lanes(std::max<int64_t>(2 * n - 16, 0)), x + 16));
}

// Packing reads its source kAhead pairs ahead of where it loads (a prefetch
// of the cache line at element i: reading at page strides, as the packing
// does, defeats the hardware's prefetchers). The prefetch helpers are
// always_inline: GCC 12 took a function holding only __builtin_prefetch for
// one without effects (IPA pure-const) and dropped its calls, so until
// 2026-12-05 13:20 no prefetch of this file was in the binary.
constexpr int64_t kAhead = 16;
[[gnu::always_inline]] inline void prefetch(const PackSource& s, int64_t i) {
  const char* p = static_cast<const char*>(s.p) + i * (s.f32 ? 4 : 2);
  __builtin_prefetch(p, 0, 3);
  if (s.f32) __builtin_prefetch(p + 64, 0, 3);
}

// r[i][j] -> r[j][i] for a 16 x 16 block of 32-bit words.
TRIDENT_BF16_TARGET void transpose16(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4g + m], lane L: column 4L + m of rows 4g .. 4g + 3
  for (int g = 0; g < 4; ++g) {
    u[4 * g] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int m = 0; m < 4; ++m) {  // 128-bit lane L of u[4g + m] goes to r[4L + m], lane g
    const __m512i s0 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44);
    const __m512i s1 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xee);
    const __m512i s2 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
    const __m512i s3 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xee);
    r[m] = _mm512_shuffle_i32x4(s0, s2, 0x88);
    r[4 + m] = _mm512_shuffle_i32x4(s0, s2, 0xdd);
    r[8 + m] = _mm512_shuffle_i32x4(s1, s3, 0x88);
    r[12 + m] = _mm512_shuffle_i32x4(s1, s3, 0xdd);
  }
}

// The words of pairs [p0, p0 + np) (both values of every pair inside K)
// for the panels (`stride` words apart) of outer indices [o0, o0 + n) of a k-major source: rows k
// and k + 1 interleaved, each pair's rows read once across all the panels,
// sixteen outer indices at a time; indices past n are written as zero.
TRIDENT_BF16_TARGET void pack_k_major(const PackSource& s, int64_t o0, int64_t n, int64_t p0,
                                      int64_t np, int64_t stride, int width, uint32_t* dst) {
  const int64_t panels = (n + width - 1) / width;
  for (int64_t p = 0; p < np; ++p) {
    const int64_t row = 2 * (p0 + p) * s.ld + o0;
    for (int64_t q = 0; q < panels; ++q)
      for (int w = 0; w < width; w += 16) {
        const int64_t x = q * width + w, valid = std::clamp<int64_t>(n - x, 0, 16);
        prefetch(s, row + x + 2 * kAhead * s.ld);
        prefetch(s, row + x + (2 * kAhead + 1) * s.ld);
        store16(dst + q * stride + p * width + w, width - w,
                interleave(load_rows(s, row + x, valid)));
      }
  }
}

// The same for one panel (outer indices [o, o + valid)) of a source whose k
// is contiguous: sixteen pairs of sixteen rows at a time, transposed.
TRIDENT_BF16_TARGET void pack_k_inner(const PackSource& s, int64_t o, int64_t valid, int64_t p0,
                                      int64_t np, int width, uint32_t* d) {
  for (int64_t p = 0; p < np; p += 16) {
    const int64_t c = std::min<int64_t>(16, np - p);
    for (int w0 = 0; w0 < width; w0 += 16) {
      __m512i r[16];
      for (int w = 0; w < 16 && w0 + w < valid; ++w)
        prefetch(s, (o + w0 + w) * s.ld + 2 * (p0 + p + kAhead));
      for (int w = 0; w < 16; ++w)
        r[w] = w0 + w < valid ? load_pairs(s, (o + w0 + w) * s.ld + 2 * (p0 + p), c)
                              : _mm512_setzero_si512();
      transpose16(r);
      for (int64_t j = 0; j < c; ++j) store16(d + (p + j) * width + w0, width - w0, r[j]);
    }
  }
}

// Panels of `width` for outer indices [o0, o0 + n) and pairs [p0, p0 + np):
// word (o, p) at dst[((o - o0) / width) * np * width + (p - p0) * width + (o - o0) % width];
// outer indices past n are zero (the tile's padding), so is k = K when K is odd.
void pack(const PackSource& s, int64_t o0, int64_t n, int64_t p0, int64_t np, int width,
          uint32_t* dst) {
  const int64_t panels = (n + width - 1) / width;
  // the pairs whose both values lie inside K: all but an odd K's last
  const int64_t full = std::clamp<int64_t>(s.K / 2 - p0, 0, np);
  if (s.k_major) pack_k_major(s, o0, n, p0, full, np * width, width, dst);
  for (int64_t q = 0; q < panels; ++q) {
    uint32_t* d = dst + q * np * width;
    const int64_t o = o0 + q * width, valid = std::min<int64_t>(width, n - q * width);
    if (!s.k_major) pack_k_inner(s, o, valid, p0, full, width, d);
    for (int64_t p = full; p < np; ++p)
      for (int64_t w = 0; w < width; ++w)
        d[p * width + w] = w < valid ? pair_at(s, o + w, 2 * (p0 + p)) : 0u;
  }
}

// What a tile does with its sums: C = alpha * acc + beta * C (beta 0: C is
// not read), or with c16 (one K block, beta 0) C16 = alpha * acc rounded to
// bf16, the bits of the f32 result rounded by round_bf16.
struct TileOut {
  float* c;
  int64_t ldc;
  int rows, cols;
  float alpha, beta;
  uint16_t* c16 = nullptr;
};

TRIDENT_BF16_TARGET void store_tile_bf16(const __m512 (&acc)[kMr][2], const TileOut& o) {
  const __m512 alpha = _mm512_set1_ps(o.alpha);
  const __mmask32 m = o.cols >= 32 ? ~__mmask32(0) : (__mmask32(1) << o.cols) - 1;
  for (int r = 0; r < o.rows; ++r) {
    const __m512i v = round32(_mm512_mul_ps(alpha, acc[r][0]), _mm512_mul_ps(alpha, acc[r][1]));
    if (o.cols >= 32)  // unmasked where it can (masked stores are slower on Zen 4)
      _mm512_storeu_si512(o.c16 + r * o.ldc, v);
    else
      _mm512_mask_storeu_epi16(o.c16 + r * o.ldc, m, v);
  }
}

TRIDENT_BF16_TARGET inline void store_tile(const __m512 (&acc)[kMr][2], const TileOut& o) {
  if (o.c16) return store_tile_bf16(acc, o);
  const __mmask16 m0 = o.cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << o.cols) - 1);
  const __mmask16 m1 = o.cols >= 32   ? __mmask16(0xffff)
                       : o.cols <= 16 ? __mmask16(0)
                                      : __mmask16((1u << (o.cols - 16)) - 1);
  const __m512 alpha = _mm512_set1_ps(o.alpha), beta = _mm512_set1_ps(o.beta);
  const bool full = o.cols >= 32;
  for (int r = 0; r < o.rows; ++r) {
    float* c = o.c + r * o.ldc;
    __m512 v0 = _mm512_mul_ps(alpha, acc[r][0]), v1 = _mm512_mul_ps(alpha, acc[r][1]);
    if (o.beta != 0.0f) {
      v0 = _mm512_fmadd_ps(beta, full ? _mm512_loadu_ps(c) : _mm512_maskz_loadu_ps(m0, c), v0);
      v1 = _mm512_fmadd_ps(beta, full ? _mm512_loadu_ps(c + 16) : _mm512_maskz_loadu_ps(m1, c + 16),
                           v1);
    }
    if (full) {  // unmasked where it can, as above
      _mm512_storeu_ps(c, v0);
      _mm512_storeu_ps(c + 16, v1);
    } else {
      _mm512_mask_storeu_ps(c, m0, v0);
      _mm512_mask_storeu_ps(c + 16, m1, v1);
    }
  }
}

// The lines of C a tile writes (and, beta != 0, reads), fetched for writing
// into the first-level cache while its last kTailPairs pairs run: C's rows
// lie a row of C apart, on as many pages, and its stores (and, past the
// first K block, loads) missed the caches after the pair loop (1024^3 on
// Zen 4: 0.81 -> 0.89 of the vdpbf16ps peak; 2026-12-05).
constexpr int64_t kTailPairs = 24;
[[gnu::always_inline]] TRIDENT_BF16_TARGET inline void prefetch_c(const TileOut& o) {
  for (int r = 0; r < o.rows; ++r) {
    if (o.c16) {
      __builtin_prefetch(o.c16 + r * o.ldc, 1, 3);
      continue;
    }
    __builtin_prefetch(o.c + r * o.ldc, 1, 3);
    __builtin_prefetch(o.c + r * o.ldc + 16, 1, 3);
  }
}

// acc += the pair products of pairs [p0, p1).
TRIDENT_BF16_TARGET inline void pairs(__m512 (&acc)[kMr][2], int64_t p0, int64_t p1,
                                      const uint32_t* a, const uint32_t* b) {
  for (int64_t p = p0; p < p1; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * kNr);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * kNr + 16);
    const uint32_t* ap = a + p * kMr;
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ap[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
}

// One kMr x 32 tile of C from np pairs: a [np][kMr] words, b [np][32] words.
TRIDENT_BF16_TARGET void tile(int64_t np, const uint32_t* a, const uint32_t* b, const TileOut& o) {
  __m512 acc[kMr][2];
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const int64_t tail = std::max<int64_t>(np - kTailPairs, 0);
  pairs(acc, 0, tail, a, b);
  prefetch_c(o);
  pairs(acc, tail, np, a, b);
  // The stores read a copy: acc itself, never addressed and every loop over
  // it unrolled, stays in registers (it lived on the stack: zeroed there and
  // loaded back before the loop, 3% of the dense step on Zen 4).
  __m512 sums[kMr][2];
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) sums[r][0] = acc[r][0], sums[r][1] = acc[r][1];
  store_tile(sums, o);
}

struct Problem {
  int64_t M, N, K;
  float alpha, beta;
  PackSource a, b;
  float* c;
  int64_t ldc;
  uint16_t* c16 = nullptr;             // a bf16 C (one K block, beta 0), else c
  const uint32_t* b_packed = nullptr;  // op(B) already packed (pack_bf16_b), else packed here
};

// Buffers kept per thread: a call allocates only when it is the largest yet.
struct Buffers {
  std::vector<uint32_t> apack, bpack;
  std::vector<float> wide;  // gemm_bf16_out's f32 result past one K block
};
Buffers& buffers() {
  thread_local Buffers b;
  return b;
}

// The tiles of rows [i0, i0 + mrows) of one K block (np pairs) from packed
// A and B.
void tiles(const Problem& pr, int64_t i0, int64_t mrows, int64_t np, float beta,
           const uint32_t* apack, const uint32_t* bpack) {
  const int64_t col_panels = (pr.N + kNr - 1) / kNr;
  const int64_t row_panels = (mrows + kMr - 1) / kMr;
  for (int64_t jb = 0; jb < col_panels; ++jb) {
    const uint32_t* b = bpack + jb * np * kNr;
    const int cols = int(std::min<int64_t>(kNr, pr.N - jb * kNr));
    for (int64_t ib = 0; ib < row_panels; ++ib) {
      const int rows = int(std::min<int64_t>(kMr, mrows - ib * kMr));
      const int64_t at = (i0 + ib * kMr) * pr.ldc + jb * kNr;
      const TileOut o{
          pr.c + at, pr.ldc, rows, cols, pr.alpha, beta, pr.c16 ? pr.c16 + at : nullptr};
      tile(np, apack + ib * np * kMr, b, o);
    }
  }
}

// One or two products of one shape (count; gemm_bf16_pair): the second's
// op(A) packed again only where it is not the first's (share_a).
struct Products {
  const Problem* pr;
  int count;
  bool share_a;
};

// The row blocks of one K block (pairs [p0, p0 + np)) against packed B
// (bpack[q] for product q): each row block of op(A) packed once for both
// products where they share it.
void row_blocks(const Products& ps, int64_t p0, int64_t np, const uint32_t* const* bpack,
                Buffers& buf) {
  const int64_t M = ps.pr[0].M;
  for (int64_t i0 = 0; i0 < M; i0 += kMc) {
    const int64_t mrows = std::min(kMc, M - i0);
    const int64_t row_panels = (mrows + kMr - 1) / kMr;
    buf.apack.resize(size_t(row_panels * np * kMr));
    for (int q = 0; q < ps.count; ++q) {
      const Problem& pr = ps.pr[q];
      if (q == 0 || !ps.share_a) pack(pr.a, i0, mrows, p0, np, kMr, buf.apack.data());
      tiles(pr, i0, mrows, np, p0 == 0 ? pr.beta : 1.0f, buf.apack.data(), bpack[q]);
    }
  }
}

// op(B) of K block p0 (np pairs): read where pr.b_packed holds all of them
// (pack_bf16_b: the same words, so the same sums), else packed into buf.
const uint32_t* b_block(const Problem& pr, int64_t p0, int64_t np, Buffers& buf) {
  const int64_t col_panels = (pr.N + kNr - 1) / kNr;
  if (pr.b_packed) return pr.b_packed + col_panels * kNr * p0;
  buf.bpack.resize(size_t(std::max<int64_t>(col_panels * np * kNr, 1)));
  pack(pr.b, 0, pr.N, p0, np, kNr, buf.bpack.data());
  return buf.bpack.data();
}

// Every K block in turn: op(B) packed (at most one of the products' op(B)
// is packed here: gemm_bf16_pair checks), then the row blocks.
void run(const Products& ps, bool share_b, Buffers& buf) {
  const Problem& pr = ps.pr[0];
  const int64_t pairs = (pr.K + 1) / 2;
  for (int64_t p0 = 0; p0 < pairs || p0 == 0; p0 += kKcPairs) {
    const int64_t np = std::min(kKcPairs, pairs - p0);
    const uint32_t* bpack[2] = {b_block(pr, p0, np, buf), nullptr};
    if (ps.count == 2) bpack[1] = share_b ? bpack[0] : b_block(ps.pr[1], p0, np, buf);
    row_blocks(ps, p0, np, bpack, buf);
    if (pairs == 0) break;
  }
}

void run(const Problem& pr, Buffers& buf) { run({&pr, 1, false}, false, buf); }

bool same(const PackSource& x, const PackSource& y) {
  return x.p == y.p && x.ld == y.ld && x.f32 == y.f32 && x.k_major == y.k_major && x.K == y.K;
}

#pragma GCC diagnostic pop

}  // namespace

void gemm_bf16(int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A, Bf16Operand B,
               float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  TRIDENT_CHECK(bf16_units().avx512_bf16, "gemm_bf16: this CPU has no AVX512-BF16");
  Buffers& buf = buffers();
  // stored A [M, K] or (trans) [K, M]; B [K, N] or (trans) [N, K]
  const PackSource a{A.p, A.ld, A.f32, A.trans, K}, b{B.p, B.ld, B.f32, !B.trans, K};
  const Problem pr{M, N, K, alpha, beta, a, b, C, ldc, nullptr, B.packed};
  run(pr, buf);
}

// Two products as one run where they share an operand and at most one
// op(B) needs packing (else two calls): each C the bits of its own call.
void gemm_bf16_pair(int64_t M, int64_t N, int64_t K, float alpha, const Bf16Product (&p)[2],
                    float beta, int64_t ldc) {
  if (M == 0 || N == 0) return;
  TRIDENT_CHECK(bf16_units().avx512_bf16, "gemm_bf16: this CPU has no AVX512-BF16");
  Problem pr[2];
  for (int q = 0; q < 2; ++q) {
    const Bf16Operand &A = p[q].A, &B = p[q].B;
    const PackSource a{A.p, A.ld, A.f32, A.trans, K}, b{B.p, B.ld, B.f32, !B.trans, K};
    pr[q] = {M, N, K, alpha, beta, a, b, p[q].C, ldc, nullptr, B.packed};
  }
  const bool share_a = same(pr[0].a, pr[1].a);
  const bool share_b = pr[0].b_packed == pr[1].b_packed && same(pr[0].b, pr[1].b);
  if ((share_a || share_b) && (share_b || pr[0].b_packed || pr[1].b_packed))
    return run({pr, 2, share_a}, share_b, buffers());
  for (const Problem& one : pr) run(one, buffers());
}

int64_t bf16_packed_words(int64_t N, int64_t K) {
  return (N + kNr - 1) / kNr * kNr * ((K + 1) / 2);
}

// Each K block's panels where run() would pack them, one after the other.
void pack_bf16_b(int64_t N, int64_t K, Bf16Operand B, uint32_t* dst) {
  TRIDENT_CHECK(bf16_units().avx512_bf16, "pack_bf16_b: this CPU has no AVX512-BF16");
  const PackSource b{B.p, B.ld, B.f32, !B.trans, K};
  const int64_t pairs = (K + 1) / 2, col_panels = (N + kNr - 1) / kNr;
  for (int64_t p0 = 0; p0 < pairs; p0 += kKcPairs)
    pack(b, 0, N, p0, std::min(kKcPairs, pairs - p0), kNr, dst + col_panels * kNr * p0);
}

// One K block (K <= 512): each tile rounds its sums as it stores them;
// else the f32 result in a scratch kept per thread, rounded row by row.
void gemm_bf16_out(int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A, Bf16Operand B,
                   uint16_t* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  TRIDENT_CHECK(bf16_units().avx512_bf16, "gemm_bf16: this CPU has no AVX512-BF16");
  Buffers& buf = buffers();
  const PackSource a{A.p, A.ld, A.f32, A.trans, K}, b{B.p, B.ld, B.f32, !B.trans, K};
  if ((K + 1) / 2 <= kKcPairs)
    return run({M, N, K, alpha, 0.0f, a, b, nullptr, ldc, C, B.packed}, buf);
  buf.wide.resize(size_t(M * N));
  run({M, N, K, alpha, 0.0f, a, b, buf.wide.data(), N, nullptr, B.packed}, buf);
  for (int64_t i = 0; i < M; ++i) round_bf16(buf.wide.data() + i * N, N, C + i * ldc);
}

#else  // not x86-64 with GCC or Clang: no native bf16 (bf16_units() finds none)

void gemm_bf16(int64_t, int64_t, int64_t, float, Bf16Operand, Bf16Operand, float, float*, int64_t) {
  throw Error("gemm_bf16: needs an x86-64 CPU with AVX512-BF16");
}
void gemm_bf16_out(int64_t, int64_t, int64_t, float, Bf16Operand, Bf16Operand, uint16_t*, int64_t) {
  throw Error("gemm_bf16: needs an x86-64 CPU with AVX512-BF16");
}
void gemm_bf16_pair(int64_t, int64_t, int64_t, float, const Bf16Product (&)[2], float, int64_t) {
  throw Error("gemm_bf16: needs an x86-64 CPU with AVX512-BF16");
}
int64_t bf16_packed_words(int64_t, int64_t) { return 0; }
void pack_bf16_b(int64_t, int64_t, Bf16Operand, uint32_t*) {
  throw Error("pack_bf16_b: needs an x86-64 CPU with AVX512-BF16");
}

#endif

}  // namespace trident::kernels::cpu

namespace trident::kernels {

#ifdef TRIDENT_BF16_NATIVE
// As run() and row_blocks() grow the buffers (4-byte words).
size_t gemm_bf16_buffer_bytes(int64_t max_n, int64_t max_wide) {
  using cpu::kKcPairs, cpu::kMc, cpu::kMr, cpu::kNr;
  const int64_t bpack = (max_n + kNr - 1) / kNr * kNr * kKcPairs;
  const int64_t apack = (kMc + kMr - 1) / kMr * kMr * kKcPairs;
  return size_t(4 * (bpack + apack + max_wide));
}
size_t gemm_bf16_packed_weight_bytes(int64_t out, int64_t in) {
  return size_t(4 * (cpu::bf16_packed_words(out, in) + cpu::bf16_packed_words(in, out)));
}
#else
size_t gemm_bf16_buffer_bytes(int64_t, int64_t) { return 0; }  // no native bf16 GEMM here
size_t gemm_bf16_packed_weight_bytes(int64_t, int64_t) { return 0; }
#endif

}  // namespace trident::kernels
