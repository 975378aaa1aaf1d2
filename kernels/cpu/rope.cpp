// Rotary position embedding. Angles are computed in double from the GLOBAL
// position so that every CP layout rotates a token identically.
//
// The cos/sin of every (position, frequency) pair are computed once per
// thread and kept in a table per (head_dim, frequencies) covering positions
// [0, rows): the same double computation rounded to float as a direct
// evaluation, so a table lookup gives the same bits, and a step no longer
// spends a million sin/cos on angles it computed the step before. The table
// is a memo of pure values (per thread, so the kernels stay free of locks);
// positions past its cap (kMaxTableFloats), or negative, are computed directly.
#include <algorithm>
#include <cmath>
#include <vector>

#include "trident/kernels/backends.hpp"

namespace trident::kernels::cpu {
namespace {

// 64 MiB of table per thread at most (head_dim 128: 131,072 positions).
constexpr int64_t kMaxTableFloats = int64_t(1) << 24;
constexpr size_t kMaxTables = 4;

// cos in [0, half), sin in [half, D) of position p's row.
void angles(int64_t p, int64_t D, const std::vector<double>& inv_freq, float* row) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double a = double(p) * inv_freq[size_t(i)];
    row[i] = static_cast<float>(std::cos(a));
    row[half + i] = static_cast<float>(std::sin(a));
  }
}

struct RopeTable {
  int64_t D = 0;
  RopeFreqs freqs;
  std::vector<double> inv_freq;
  int64_t rows = 0;
  std::vector<float> cs;  // [rows, D]

  void grow(int64_t want) {
    int64_t r = std::max<int64_t>(rows, 1);
    while (r < want) r *= 2;
    r = std::min(r, kMaxTableFloats / D);
    cs.resize(size_t(r * D));
    for (int64_t p = rows; p < r; ++p) angles(p, D, inv_freq, cs.data() + p * D);
    rows = r;
  }
};

// The table for (D, freqs) covering positions [0, want) where it may.
RopeTable& table_for(int64_t D, const RopeFreqs& freqs, int64_t want) {
  thread_local std::vector<RopeTable> tables;
  auto it = std::find_if(tables.begin(), tables.end(),
                         [&](const RopeTable& t) { return t.D == D && t.freqs == freqs; });
  if (it == tables.end()) {
    if (tables.size() == kMaxTables) tables.erase(tables.begin());
    RopeTable t;
    t.D = D;
    t.freqs = freqs;
    for (int64_t i = 0; i < D / 2; ++i) t.inv_freq.push_back(rope_inv_freq(freqs, i, D));
    tables.push_back(std::move(t));
    it = tables.end() - 1;
  }
  if (it->rows < want) it->grow(want);
  return *it;
}

// Rotates the H heads of one token by the angles of cs (cos, then sin);
// inverse: by the negated angles (the backward).
template <bool inverse>
void rotate_token(float* x, const float* cs, int64_t H, int64_t D) {
  const int64_t half = D / 2;
  const float* c = cs;
  const float* s = cs + half;
  for (int64_t h = 0; h < H; ++h) {
    float* v = x + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      if (inverse) {
        v[i] = a * c[i] + b * s[i];
        v[i + half] = b * c[i] - a * s[i];
      } else {
        v[i] = a * c[i] - b * s[i];
        v[i + half] = a * s[i] + b * c[i];
      }
    }
  }
}

template <bool inverse>
void rotate(float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D, const RopeFreqs& freqs) {
  if (T == 0 || D < 2) return;
  // A table grows to cover a call's positions only where it can cover all
  // of them; positions past it are computed directly.
  const int64_t hi = *std::max_element(pos, pos + T);
  const RopeTable& tab = table_for(D, freqs, hi < kMaxTableFloats / D ? hi + 1 : 0);
  std::vector<float> direct;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = pos[t];
    const float* cs = nullptr;
    if (p >= 0 && p < tab.rows) {
      cs = tab.cs.data() + p * D;
    } else {
      direct.resize(size_t(D));
      angles(p, D, tab.inv_freq, direct.data());
      cs = direct.data();
    }
    rotate_token<inverse>(x + t * H * D, cs, H, D);
  }
}

}  // namespace

void rope_forward(const Ctx& ctx, float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                  const RopeFreqs& freqs) {
  rotate<false>(x, pos, T, H, D, freqs);
}

void rope_backward(const Ctx& ctx, float* dx, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                   const RopeFreqs& freqs) {
  rotate<true>(dx, pos, T, H, D, freqs);
}

}  // namespace trident::kernels::cpu
