// The document-balanced cp layout (see parallel/cp/document_layout.hpp).
#include "trident/parallel/cp/document_layout.hpp"

#include <algorithm>
#include <numeric>

#include "trident/core/error.hpp"

namespace trident::cp {

std::vector<int64_t> pairs_per_query(const int32_t* doc_ids, int64_t seq_len, int64_t window) {
  std::vector<int64_t> pairs(static_cast<size_t>(seq_len));
  int64_t start = 0;
  for (int64_t i = 0; i < seq_len; ++i) {
    if (i > 0 && doc_ids[i] != doc_ids[i - 1]) start = i;
    const int64_t seen = i - start + 1;
    pairs[size_t(i)] = window > 0 ? std::min(seen, window) : seen;
  }
  return pairs;
}

namespace {

// Chunks of one rank (indices into the chunk list) and their summed work.
struct Bin {
  std::vector<int> chunks;
  double load = 0;
};

// Longest first onto the least loaded rank with room (ties: the lower chunk,
// the lower rank), `per` chunks per rank.
std::vector<Bin> greedy(const std::vector<double>& work, int cp, int per) {
  std::vector<int> order(work.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return work[size_t(a)] > work[size_t(b)]; });
  std::vector<Bin> bins(static_cast<size_t>(cp));
  for (int c : order) {
    size_t best = bins.size();
    for (size_t r = 0; r < bins.size(); ++r)
      if (int(bins[r].chunks.size()) < per &&
          (best == bins.size() || bins[r].load < bins[best].load))
        best = r;
    bins[best].chunks.push_back(c);
    bins[best].load += work[size_t(c)];
  }
  return bins;
}

// Swaps a chunk of the most loaded rank for a lighter one of another rank,
// the swap that lowers the pair's maximum most, until none lowers it. Each
// swap lowers the most loaded rank's load and leaves the other below the old
// maximum, so the sorted loads fall and the loop ends; the cap is a guard.
void improve(const std::vector<double>& work, std::vector<Bin>& bins) {
  for (int round = 0; round < 64 * int(work.size()); ++round) {
    size_t a = 0;
    for (size_t r = 1; r < bins.size(); ++r)
      if (bins[r].load > bins[a].load) a = r;
    double best = bins[a].load;
    size_t bb = 0, ia = 0, ib = 0;
    bool found = false;
    for (size_t b = 0; b < bins.size(); ++b) {
      if (b == a) continue;
      for (size_t i = 0; i < bins[a].chunks.size(); ++i)
        for (size_t j = 0; j < bins[b].chunks.size(); ++j) {
          const double d = work[size_t(bins[a].chunks[i])] - work[size_t(bins[b].chunks[j])];
          if (d <= 0) continue;
          const double top = std::max(bins[a].load - d, bins[b].load + d);
          if (top < best) {
            best = top;
            bb = b, ia = i, ib = j;
            found = true;
          }
        }
    }
    if (!found) return;
    const double d = work[size_t(bins[a].chunks[ia])] - work[size_t(bins[bb].chunks[ib])];
    std::swap(bins[a].chunks[ia], bins[bb].chunks[ib]);
    bins[a].load -= d;
    bins[bb].load += d;
  }
}

double imbalance(const std::vector<Bin>& bins) {
  double sum = 0, top = 0;
  for (const Bin& b : bins) sum += b.load, top = std::max(top, b.load);
  return sum > 0 ? top / (sum / double(bins.size())) : 1.0;
}

// Rank r's chunks (of `chunk` tokens) in sequence order, adjacent ones merged.
SeqLayout runs_of(const std::vector<Bin>& bins, int64_t chunk) {
  SeqLayout layout;
  for (const Bin& b : bins) {
    std::vector<int> cs = b.chunks;
    std::sort(cs.begin(), cs.end());
    std::vector<TokenRun> runs;
    int64_t offset = 0;
    for (int c : cs) {
      const int64_t pos0 = int64_t(c) * chunk;
      if (!runs.empty() && runs.back().pos0 + runs.back().length == pos0)
        runs.back().length += chunk;
      else
        runs.push_back(TokenRun{offset, pos0, chunk});
      offset += chunk;
    }
    layout.push_back(std::move(runs));
  }
  return layout;
}

}  // namespace

SeqLayout balance_documents(const int32_t* doc_ids, int64_t seq_len, int cp, int64_t window,
                            int64_t min_chunk) {
  TRIDENT_CHECK(cp >= 1 && seq_len > 0 && seq_len % (2 * int64_t(cp)) == 0,
                "balance_documents: seq_len " + std::to_string(seq_len) +
                    " does not split into 2*cp = " + std::to_string(2 * cp) + " chunks");
  const std::vector<int64_t> pairs = pairs_per_query(doc_ids, seq_len, window);
  std::vector<Bin> best;
  int64_t best_chunk = 0;
  double best_imbalance = 0;
  for (int64_t n = 2 * int64_t(cp); seq_len % n == 0; n *= 2) {
    const int64_t chunk = seq_len / n;
    if (n > 2 * int64_t(cp) && chunk < min_chunk) break;
    std::vector<double> work(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < seq_len; ++i) work[size_t(i / chunk)] += double(pairs[size_t(i)]);
    std::vector<Bin> bins = greedy(work, cp, int(n / cp));
    improve(work, bins);
    const double imb = imbalance(bins);
    if (best.empty() || imb < best_imbalance) {
      best = std::move(bins);
      best_chunk = chunk;
      best_imbalance = imb;
    }
    if (best_imbalance <= kDocBalanceGoal) break;
  }
  return runs_of(best, best_chunk);
}

std::vector<double> layout_pairs(const SeqLayout& layout, const std::vector<int64_t>& pairs) {
  std::vector<double> out;
  for (const auto& runs : layout) {
    double sum = 0;
    for (const TokenRun& r : runs)
      for (int64_t i = r.pos0; i < r.pos0 + r.length; ++i) sum += double(pairs[size_t(i)]);
    out.push_back(sum);
  }
  return out;
}

std::vector<int64_t> run_positions(const std::vector<TokenRun>& runs) {
  std::vector<int64_t> pos;
  for (const TokenRun& r : runs)
    for (int64_t i = 0; i < r.length; ++i) pos.push_back(r.pos0 + i);
  return pos;
}

}  // namespace trident::cp
