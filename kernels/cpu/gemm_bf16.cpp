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
#include <algorithm>
#include <cstring>
#include <vector>

#include "bf16_round.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/cpu_bf16.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define TRIDENT_BF16_NATIVE 1
#include <immintrin.h>
#define TRIDENT_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))
#endif

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

// A bf16 matrix as stored: element (r, c) at p[r * ld + c].
struct Bf16View {
  const uint16_t* p;
  int64_t ld;
};

// x[0:n] rounded to bf16 as round_to_bf16 does (nearest even on the bit
// pattern, a NaN kept quiet), sixteen at a time.
TRIDENT_BF16_TARGET void round_row(const float* x, int64_t n, uint16_t* y) {
  const __m512i exp = _mm512_set1_epi32(0x7f800000), man = _mm512_set1_epi32(0x007fffff);
  const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  const __m512i quiet = _mm512_set1_epi32(0x00400000);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(x + i));
    const __mmask16 nan =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp), exp) & _mm512_test_epi32_mask(u, man);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(bias, lsb));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
  for (; i < n; ++i) y[i] = round_to_bf16(x[i]);
}

// A's or B's storage in bf16: as given, or rounded from f32 into `buf`
// (rows x cols as stored, contiguous).
Bf16View as_bf16(const Bf16Operand& o, int64_t rows, int64_t cols, std::vector<uint16_t>& buf) {
  if (!o.f32) return {static_cast<const uint16_t*>(o.p), o.ld};
  buf.resize(size_t(rows * cols));
  const float* src = static_cast<const float*>(o.p);
  for (int64_t r = 0; r < rows; ++r) round_row(src + r * o.ld, cols, buf.data() + r * cols);
  return {buf.data(), cols};
}

// The packing of one operand: `outer` is the index of op(A)'s rows or
// op(B)'s columns (the panel's width), k the depth. k_major: element (outer,
// k) at v.p[k * ld + outer], else at v.p[outer * ld + k].
struct PackSource {
  Bf16View v;
  bool k_major;
  int64_t K;
};

uint32_t pair_at(const PackSource& s, int64_t outer, int64_t k) {
  const auto at = [&](int64_t kk) -> uint32_t {
    if (kk >= s.K) return 0;
    return s.k_major ? s.v.p[kk * s.v.ld + outer] : s.v.p[outer * s.v.ld + kk];
  };
  return at(k) | (at(k + 1) << 16);
}

// One panel's words for outer indices [o, o + valid) and pairs [p0, p0 +
// np), both pairs' values inside K (the fast paths of pack).
void pack_full(const PackSource& s, int64_t o, int64_t valid, int64_t p0, int64_t np, int width,
               uint32_t* d) {
  const uint16_t* src = s.v.p;
  const int64_t ld = s.v.ld;
  if (s.k_major) {  // rows k and k + 1 interleaved
    for (int64_t p = 0; p < np; ++p) {
      const uint16_t* r0 = src + 2 * (p0 + p) * ld + o;
      const uint16_t* r1 = r0 + ld;
      for (int64_t w = 0; w < valid; ++w)
        d[p * width + w] = uint32_t(r0[w]) | (uint32_t(r1[w]) << 16);
    }
    return;
  }
  for (int64_t w = 0; w < valid; ++w) {  // each pair one 32-bit word of the row
    const uint16_t* row = src + (o + w) * ld + 2 * p0;
    for (int64_t p = 0; p < np; ++p) std::memcpy(&d[p * width + w], row + 2 * p, 4);
  }
}

// Panels of `width` for outer indices [o0, o0 + n) and pairs [p0, p0 + np):
// word (o, p) at dst[((o - o0) / width) * np * width + (p - p0) * width + (o - o0) % width];
// outer indices past n are zero (the tile's padding), so is k = K when K is odd.
void pack(const PackSource& s, int64_t o0, int64_t n, int64_t p0, int64_t np, int width,
          uint32_t* dst) {
  const int64_t panels = (n + width - 1) / width;
  // the pairs whose both values lie inside K: all but an odd K's last
  const int64_t full = std::min(np, s.K / 2 - p0);
  for (int64_t q = 0; q < panels; ++q) {
    uint32_t* d = dst + q * np * width;
    const int64_t o = o0 + q * width, valid = std::min<int64_t>(width, n - q * width);
    if (valid < width)
      for (int64_t p = 0; p < np; ++p) std::fill_n(d + p * width + valid, width - valid, 0u);
    pack_full(s, o, valid, p0, full, width, d);
    for (int64_t p = full; p < np; ++p)
      for (int64_t w = 0; w < valid; ++w) d[p * width + w] = pair_at(s, o + w, 2 * (p0 + p));
  }
}

// What a tile does with its sums: C = alpha * acc + beta * C (beta 0: C is
// not read).
struct TileOut {
  float* c;
  int64_t ldc;
  int rows, cols;
  float alpha, beta;
};

TRIDENT_BF16_TARGET inline void store_tile(const __m512 (&acc)[kMr][2], const TileOut& o) {
  const __mmask16 m0 = o.cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << o.cols) - 1);
  const __mmask16 m1 = o.cols >= 32   ? __mmask16(0xffff)
                       : o.cols <= 16 ? __mmask16(0)
                                      : __mmask16((1u << (o.cols - 16)) - 1);
  const __m512 alpha = _mm512_set1_ps(o.alpha), beta = _mm512_set1_ps(o.beta);
  for (int r = 0; r < o.rows; ++r) {
    float* c = o.c + r * o.ldc;
    __m512 v0 = _mm512_mul_ps(alpha, acc[r][0]), v1 = _mm512_mul_ps(alpha, acc[r][1]);
    if (o.beta != 0.0f) {
      v0 = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m0, c), v0);
      v1 = _mm512_fmadd_ps(beta, _mm512_maskz_loadu_ps(m1, c + 16), v1);
    }
    _mm512_mask_storeu_ps(c, m0, v0);
    _mm512_mask_storeu_ps(c + 16, m1, v1);
  }
}

// One kMr x 32 tile of C from np pairs: a [np][kMr] words, b [np][32] words.
TRIDENT_BF16_TARGET void tile(int64_t np, const uint32_t* a, const uint32_t* b, const TileOut& o) {
  __m512 acc[kMr][2];
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * kNr);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * kNr + 16);
    const uint32_t* ap = a + p * kMr;
#pragma GCC unroll 12
    for (int r = 0; r < kMr; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ap[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
  }
  store_tile(acc, o);
}

struct Problem {
  int64_t M, N, K;
  float alpha, beta;
  PackSource a, b;
  float* c;
  int64_t ldc;
};

// Buffers kept per thread: a call allocates only when it is the largest yet.
struct Buffers {
  std::vector<uint16_t> a16, b16;
  std::vector<uint32_t> apack, bpack;
};
Buffers& buffers() {
  thread_local Buffers b;
  return b;
}

// The row blocks of one K block (pairs [p0, p0 + np)) against packed B.
void row_blocks(const Problem& pr, int64_t p0, int64_t np, float beta, Buffers& buf) {
  const int64_t col_panels = (pr.N + kNr - 1) / kNr;
  for (int64_t i0 = 0; i0 < pr.M; i0 += kMc) {
    const int64_t mrows = std::min(kMc, pr.M - i0);
    const int64_t row_panels = (mrows + kMr - 1) / kMr;
    buf.apack.resize(size_t(row_panels * np * kMr));
    pack(pr.a, i0, mrows, p0, np, kMr, buf.apack.data());
    for (int64_t jb = 0; jb < col_panels; ++jb) {
      const uint32_t* b = buf.bpack.data() + jb * np * kNr;
      const int cols = int(std::min<int64_t>(kNr, pr.N - jb * kNr));
      for (int64_t ib = 0; ib < row_panels; ++ib) {
        const int rows = int(std::min<int64_t>(kMr, mrows - ib * kMr));
        const TileOut o{
            pr.c + (i0 + ib * kMr) * pr.ldc + jb * kNr, pr.ldc, rows, cols, pr.alpha, beta};
        tile(np, buf.apack.data() + ib * np * kMr, b, o);
      }
    }
  }
}

void run(const Problem& pr, Buffers& buf) {
  const int64_t pairs = (pr.K + 1) / 2;
  const int64_t col_panels = (pr.N + kNr - 1) / kNr;
  for (int64_t p0 = 0; p0 < pairs || p0 == 0; p0 += kKcPairs) {
    const int64_t np = std::min(kKcPairs, pairs - p0);
    buf.bpack.resize(size_t(std::max<int64_t>(col_panels * np * kNr, 1)));
    pack(pr.b, 0, pr.N, p0, np, kNr, buf.bpack.data());
    row_blocks(pr, p0, np, p0 == 0 ? pr.beta : 1.0f, buf);
    if (pairs == 0) break;
  }
}

#pragma GCC diagnostic pop

}  // namespace

void gemm_bf16(int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A, Bf16Operand B,
               float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  TRIDENT_CHECK(bf16_units().avx512_bf16, "gemm_bf16: this CPU has no AVX512-BF16");
  Buffers& buf = buffers();
  // stored shapes: A [M, K] or [K, M]; B [K, N] or [N, K]
  const Bf16View a = as_bf16(A, A.trans ? K : M, A.trans ? M : K, buf.a16);
  const Bf16View b = as_bf16(B, B.trans ? N : K, B.trans ? K : N, buf.b16);
  const Problem pr{M, N, K, alpha, beta, {a, A.trans, K}, {b, !B.trans, K}, C, ldc};
  run(pr, buf);
}

void round_bf16(const float* x, int64_t n, uint16_t* y) { round_row(x, n, y); }

void gemm_bf16_out(int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A, Bf16Operand B,
                   uint16_t* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  std::vector<float> wide(size_t(M * N));
  gemm_bf16(M, N, K, alpha, A, B, 0.0f, wide.data(), N);
  for (int64_t i = 0; i < M; ++i) round_row(wide.data() + i * N, N, C + i * ldc);
}

#else  // not x86-64 with GCC or Clang: no native bf16 (bf16_units() finds none)

void gemm_bf16(int64_t, int64_t, int64_t, float, Bf16Operand, Bf16Operand, float, float*, int64_t) {
  throw Error("gemm_bf16: needs an x86-64 CPU with AVX512-BF16");
}
void round_bf16(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = round_to_bf16(x[i]);
}
void gemm_bf16_out(int64_t, int64_t, int64_t, float, Bf16Operand, Bf16Operand, uint16_t*, int64_t) {
  throw Error("gemm_bf16: needs an x86-64 CPU with AVX512-BF16");
}

#endif

}  // namespace trident::kernels::cpu
