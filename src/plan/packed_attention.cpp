// Packed attention pairs and layout imbalance (see plan/packed_attention.hpp).
#include "trident/plan/packed_attention.hpp"

#include <algorithm>

#include "trident/core/rng.hpp"
#include "trident/parallel/cp/document_layout.hpp"
#include "trident/parallel/cp/ring_attention.hpp"

namespace trident::plan {
namespace {

// sum_{k=1..K} k and k^2
double s1(double K) { return K * (K + 1) / 2; }
double s2(double K) { return K * (K + 1) * (2 * K + 1) / 6; }

// g(L): the expected pairs of a document's L tokens (see the header).
double doc_pairs(double L, double S, double W) {
  const double K = std::min({L, S, W > 0 ? W : L}) - 1;
  return L + (K * L * S - (L + S) * s1(K) + s2(K)) / S;
}

// Bin b's lengths [2^b, 2^(b+1)) as at most kPoints equally spaced ones, each
// standing for `weight` lengths: the sums over a wide bin stay cheap.
constexpr int64_t kPoints = 2048;

template <typename F>
void for_bin_lengths(size_t b, F&& f) {
  const int64_t lo = int64_t(1) << b, n = lo;  // lengths lo .. 2 lo - 1
  const int64_t step = std::max<int64_t>(1, n / kPoints);
  for (int64_t i = 0; i < n; i += step) {
    const int64_t take = std::min(step, n - i);
    f(double(lo + i) + double(take - 1) / 2, double(take) / double(n));
  }
}

}  // namespace

double packed_pairs_per_sequence(const std::vector<int64_t>& bins, int64_t seq_len,
                                 int64_t window) {
  const double S = double(seq_len), W = double(window);
  double g = 0, len = 0;  // sums over documents of g(L) and L
  for (size_t b = 0; b < bins.size(); ++b) {
    if (bins[b] <= 0) continue;
    for_bin_lengths(b, [&](double L, double share) {
      g += double(bins[b]) * share * doc_pairs(L, S, W);
      len += double(bins[b]) * share * L;
    });
  }
  if (len <= 0) {  // one endless document: g(L) / L as L grows
    const double K = std::min(S, W > 0 ? W : S) - 1;
    return S * (1 + K - s1(K) / S);
  }
  return S * g / len;
}

double packed_layout_imbalance(const std::vector<int64_t>& bins, int64_t seq_len, int cp,
                               CpLayout layout, int64_t window) {
  if (cp <= 1) return 1.0;
  int64_t docs = 0;
  for (int64_t n : bins) docs += std::max<int64_t>(0, n);
  constexpr int kSequences = 16;
  const uint64_t key = rng::hash_name("plan.packed");
  uint64_t ctr = 0;
  // Draw a bin by its document count, then a length in it.
  auto draw = [&]() -> int64_t {
    if (docs == 0) return seq_len * kSequences * 2;
    int64_t pick = int64_t(rng::below(key, ctr++, uint64_t(docs)));
    size_t b = 0;
    while (pick >= bins[b]) pick -= std::max<int64_t>(0, bins[b++]);
    const int64_t lo = int64_t(1) << b;
    return lo + int64_t(rng::below(key, ctr++, uint64_t(lo)));
  };
  int64_t left = draw(), offset = int64_t(rng::below(key, ctr++, uint64_t(left)));
  left -= offset;  // the first sequence starts inside a document
  double sum = 0;
  std::vector<int32_t> ids(static_cast<size_t>(seq_len));
  for (int s = 0; s < kSequences; ++s) {
    int32_t id = 0;
    for (int64_t i = 0; i < seq_len; ++i) {
      if (left == 0) {
        left = draw();
        if (i > 0) ++id;
      }
      ids[size_t(i)] = id;
      --left;
    }
    const std::vector<int64_t> pairs = cp::pairs_per_query(ids.data(), seq_len, window);
    cp::SeqLayout runs;
    if (layout == CpLayout::docs) {
      runs = cp::balance_documents(ids.data(), seq_len, cp, window);
    } else {
      for (int r = 0; r < cp; ++r) runs.push_back(cp::local_runs(seq_len, cp, r, layout));
    }
    const std::vector<double> load = cp::layout_pairs(runs, pairs);
    double total = 0, top = 0;
    for (double l : load) total += l, top = std::max(top, l);
    sum += total > 0 ? top / (total / cp) : 1.0;
  }
  return sum / kSequences;
}

double packed_pairs_busiest_rank(const std::vector<int64_t>& bins, int64_t seq_len, int cp,
                                 CpLayout layout, int64_t window) {
  const double pairs = packed_pairs_per_sequence(bins, seq_len, window);
  if (cp <= 1) return pairs;
  return pairs / cp * packed_layout_imbalance(bins, seq_len, cp, layout, window);
}

}  // namespace trident::plan
