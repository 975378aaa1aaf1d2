// Packed documents in the cost model (data.packing = "documents"): the
// attention pairs of a sequence cut from a stream of documents whose lengths
// follow a histogram, and how evenly a cp layout spreads them.
//
// The data cuts sequences of S tokens out of the documents laid end to end,
// at places that do not depend on the boundaries. A token at offset o of its
// document and at place t of its sequence sees min(o, t, W - 1) + 1 keys
// (W: model.window, or no cap). A random token lies in a document of length
// L with probability L P(L) / E[L], its o is uniform on [0, L) and its t
// uniform on [0, S), independent of o, so the expected pairs of a sequence
// are
//     S * E[g(L)] / E[L],   g(L) = sum over o < L of E_t[min(o, t, W-1) + 1]
//                                 = L + sum_{k=1..K} (L - k)(S - k) / S,
//                                   K = min(L, S, W) - 1.
// For documents much shorter than S and W, g(L) = L(L+1)/2: the pairs are
// S (E[L^2] + E[L]) / (2 E[L]), the mean squared length over twice the mean
// length per token; the -L^3/(6S) in g for L <= S is the pairs lost where a
// sequence boundary cuts a document; one endless document gives the causal
// S(S+1)/2. Within a bin [2^b, 2^(b+1)) of the histogram every length is
// taken as equally likely.
//
// The layout's imbalance (the busiest rank's pairs over the mean rank's) is
// simulated: 16 sequences packed from documents drawn from the histogram
// with a fixed seed, each laid out by the layout (docs: balance_documents),
// the per-rank pairs counted exactly, max/mean averaged.
#pragma once
#include <cstdint>
#include <vector>

#include "trident/core/config.hpp"

namespace trident::plan {

// Expected visible (query, key) pairs of one sequence of seq_len tokens
// (formula above); window 0: none. log2_bins[b]: documents with lengths in
// [2^b, 2^(b+1)). Empty (or no document): the causal pairs of one sequence.
double packed_pairs_per_sequence(const std::vector<int64_t>& log2_bins, int64_t seq_len,
                                 int64_t window);

// The layout's busiest rank over its mean rank on a ring of cp ranks,
// simulated (1 for cp = 1).
double packed_layout_imbalance(const std::vector<int64_t>& log2_bins, int64_t seq_len, int cp,
                               CpLayout layout, int64_t window);

// Pairs of one sequence on the busiest rank: pairs / cp * imbalance.
double packed_pairs_busiest_rank(const std::vector<int64_t>& log2_bins, int64_t seq_len, int cp,
                                 CpLayout layout, int64_t window);

}  // namespace trident::plan
