// The document-balanced cp layout (see parallel/cp/document_layout.hpp).
#include "trident/parallel/cp/document_layout.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "trident/core/error.hpp"
#include "trident/kernels/attention_tiles.hpp"

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

RingWork& RingWork::operator+=(const RingWork& o) {
  visible += o.visible, computed += o.computed, pieces += o.pieces;
  tile_rows += o.tile_rows, calls += o.calls;
  return *this;
}

double RingWork::cost() const {
  return computed + kTileCost.piece * pieces + kTileCost.tile_row * tile_rows +
         kTileCost.call * calls;
}

namespace {

using kernels::kKeyBlock;
using kernels::kQueryBlock;
// One tile [j0, j0 + cols) of the query block [i0, i0 + rows): the pairs
// its rows see, and the pairs, GEMM pieces and rows the CPU kernel computes
// for it (its own tile plan, attention_tiles.hpp).
void add_tile(const kernels::AttnShape& s, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
              RingWork& w) {
  kernels::AttnTile t;
  kernels::attn_view_tile(s, i0, rows, j0, cols, &t);
  for (int64_t i = 0; i < rows; ++i) w.visible += double(t.n[i]);
  if (t.empty()) return;
  w.tile_rows += double(rows);
  w.pieces += double(t.n_pieces);
  for (int u = 0; u < t.n_pieces; ++u) {
    const kernels::AttnPiece& p = t.piece[u];
    w.computed += double((p.r1 - p.r0) * (p.c1 - p.c0));
  }
}

// Whether every row of the query block sees every key of [jb, je): the row
// intervals' starts and ends are non-decreasing along the rows (causal end,
// window start and document bounds all move forward), so the first row's
// end and the last row's start decide.
bool full_block(const kernels::AttnShape& s, int64_t i0, int64_t rows, int64_t jb, int64_t je) {
  int64_t a, b;
  kernels::attn_row_keys(s, i0, jb, je - jb, &a, &b);
  if (a != 0 || b != je - jb) return false;
  kernels::attn_row_keys(s, i0 + rows - 1, jb, je - jb, &a, &b);
  return a == 0 && b == je - jb;
}

// A kernel shape over global positions and the sequence's document ids.
kernels::AttnShape host_shape(const int32_t* doc_ids, int64_t q0, int64_t tq, int64_t k0,
                              int64_t tk, int64_t window) {
  kernels::AttnShape s;
  s.Tq = tq, s.Tk = tk, s.causal = true, s.q_pos0 = q0, s.k_pos0 = k0, s.window = window;
  if (doc_ids) s.q_doc = doc_ids + q0, s.k_doc = doc_ids + k0;
  return s;
}

// The work of the ring's call for a query tile against a key run, skipped
// (zero) where the ring skips it: all keys after the queries, no shared
// document, no visible pair.
RingWork tile_call(const int32_t* doc_ids, int64_t q0, int64_t tq, int64_t k0, int64_t tk,
                   int64_t window) {
  if (k0 > q0 + tq - 1) return {};
  if (doc_ids && (doc_ids[q0 + tq - 1] < doc_ids[k0] || doc_ids[q0] > doc_ids[k0 + tk - 1]))
    return {};
  if (window > 0 && q0 - (k0 + tk - 1) >= window) return {};
  RingWork w = call_work(host_shape(doc_ids, q0, tq, k0, tk, window));
  return w.visible > 0 ? w : RingWork{};
}

}  // namespace

RingWork call_work(const kernels::AttnShape& s) {
  RingWork w;
  w.calls = 1;
  for (int64_t i0 = 0; i0 < s.Tq; i0 += kQueryBlock) {
    const int64_t rows = std::min(kQueryBlock, s.Tq - i0);
    int64_t jb, je;
    kernels::attn_key_range(s, i0, rows, &jb, &je);
    if (je <= jb) continue;
    if (full_block(s, i0, rows, jb, je)) {
      const double keys = double(je - jb), tiles = std::ceil(keys / double(kKeyBlock));
      w.visible += double(rows) * keys, w.computed += double(rows) * keys;
      w.pieces += tiles, w.tile_rows += double(rows) * tiles;
      continue;
    }
    for (int64_t jt = jb; jt < je; jt += kKeyBlock)
      add_tile(s, i0, rows, jt, std::min(kKeyBlock, je - jt), w);
  }
  return w;
}

std::vector<RingWork> ring_work(const SeqLayout& layout, const int32_t* doc_ids, int64_t seq_len,
                                int64_t window) {
  const int cp = int(layout.size());
  std::vector<RingWork> out(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r)
    for (int step = 0; step < cp; ++step)
      for (const TokenRun& kr : layout[size_t((r - step + cp) % cp)])
        for (const TokenRun& run : layout[size_t(r)])
          for (int64_t i = 0; i < run.length; i += kQueryBlock) {
            TRIDENT_CHECK(kr.pos0 + kr.length <= seq_len && run.pos0 + run.length <= seq_len,
                          "ring_work: a run outside the sequence");
            out[size_t(r)] +=
                tile_call(doc_ids, run.pos0 + i, std::min(kQueryBlock, run.length - i), kr.pos0,
                          kr.length, window);
          }
  return out;
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

// The modelled time of each chunk's queries (its query tiles against every
// key chunk before it), as if every chunk were a run of its own; a rank
// holding neighbouring chunks merges them, which the exact count
// (ring_work) of the finished layout sees.
std::vector<double> chunk_costs(const int32_t* doc_ids, int64_t seq_len, int64_t chunk,
                                int64_t window) {
  const int64_t n = seq_len / chunk;
  std::vector<double> work(static_cast<size_t>(n), 0.0);
  int64_t doc_start = 0;  // of the document holding the current chunk's first query
  for (int64_t c = 0; c < n; ++c) {
    // Keys before the chunk's first document's start, or its first query's
    // window, see none of its queries.
    const int64_t q0 = c * chunk;
    if (doc_ids && q0 > 0 && doc_ids[q0] != doc_ids[q0 - 1]) {
      doc_start = q0;  // the document starts here; else search back inside the last chunk
    } else if (doc_ids && q0 > 0 && doc_ids[doc_start] != doc_ids[q0]) {
      doc_start = q0 - chunk;
      while (doc_ids[doc_start] != doc_ids[q0]) ++doc_start;
    }
    int64_t from = doc_ids ? doc_start : 0;
    if (window > 0) from = std::max(from, q0 - window + 1);
    for (int64_t j = std::max<int64_t>(0, from) / chunk; j <= c; ++j)
      for (int64_t i = 0; i < chunk; i += kQueryBlock)
        work[size_t(c)] += tile_call(doc_ids, c * chunk + i, std::min(kQueryBlock, chunk - i),
                                     j * chunk, chunk, window)
                               .cost();
  }
  return work;
}

double max_cost(const std::vector<RingWork>& w) {
  double top = 0;
  for (const RingWork& r : w) top = std::max(top, r.cost());
  return top;
}

}  // namespace

namespace {

// One candidate layout: its ranks' visible pairs, most over mean, and its
// slowest rank's modelled time.
struct Candidate {
  SeqLayout layout;
  double pairs_imbalance = 0, top_cost = 0;
};

Candidate assess(SeqLayout layout, const int32_t* doc_ids, int64_t seq_len, int64_t window,
                 const std::vector<int64_t>& pairs) {
  Candidate c;
  double sum = 0, top = 0;
  for (double l : layout_pairs(layout, pairs)) sum += l, top = std::max(top, l);
  c.pairs_imbalance = sum > 0 ? top / (sum / double(layout.size())) : 1.0;
  c.top_cost = max_cost(ring_work(layout, doc_ids, seq_len, window));
  c.layout = std::move(layout);
  return c;
}

// Within the FLOP goal the faster slowest rank wins; a layout within it
// beats one outside it; outside it the more even pairs win.
bool better(const Candidate& a, const Candidate& b) {
  const bool a_ok = a.pairs_imbalance <= kDocFlopGoal, b_ok = b.pairs_imbalance <= kDocFlopGoal;
  if (a_ok != b_ok) return a_ok;
  if (a_ok) return a.top_cost < b.top_cost * (1 - 1e-9);
  return a.pairs_imbalance < b.pairs_imbalance * (1 - 1e-12);
}

}  // namespace

SeqLayout balance_documents(const int32_t* doc_ids, int64_t seq_len, int cp, int64_t window,
                            int64_t min_chunk) {
  TRIDENT_CHECK(cp >= 1 && seq_len > 0 && seq_len % (2 * int64_t(cp)) == 0,
                "balance_documents: seq_len " + std::to_string(seq_len) +
                    " does not split into 2*cp = " + std::to_string(2 * cp) + " chunks");
  const std::vector<int64_t> pairs = pairs_per_query(doc_ids, seq_len, window);
  // For each chunk count n = 2*cp*m two assignments: by visible pairs and by
  // modelled time. More chunks balance finer but cut the runs into more,
  // smaller kernel calls, which the model weighs.
  Candidate best;
  bool have = false;
  for (int64_t n = 2 * int64_t(cp); seq_len % n == 0; n *= 2) {
    const int64_t chunk = seq_len / n;
    if (n > 2 * int64_t(cp) && chunk < min_chunk) break;
    std::vector<double> by_pairs(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < seq_len; ++i) by_pairs[size_t(i / chunk)] += double(pairs[size_t(i)]);
    bool improved = false;
    for (const std::vector<double>& work :
         {by_pairs, chunk_costs(doc_ids, seq_len, chunk, window)}) {
      std::vector<Bin> bins = greedy(work, cp, int(n / cp));
      improve(work, bins);
      Candidate c = assess(runs_of(bins, chunk), doc_ids, seq_len, window, pairs);
      if (!have || better(c, best)) best = std::move(c), have = improved = true;
    }
    // Finer chunks only add calls once they stop paying: stop at the first
    // chunk count that improves nothing on a layout within the goal.
    if (!improved && best.pairs_imbalance <= kDocFlopGoal) break;
  }
  return best.layout;
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
