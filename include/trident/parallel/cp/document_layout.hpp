// parallel.cp_layout = "docs": a cp layout chosen per sequence from its
// packed documents, so that every rank of the ring computes the same number
// of (query, key) pairs.
//
// Zig-zag balances the causal triangle of one sequence. A packed sequence's
// work is the sum of its documents' triangles (a query sees the keys of its
// own document up to itself, at most model.window of them), wherever the
// documents fall, so zig-zag leaves one rank with a long document's triangle.
// The document layout prices each token by the keys it sees, cuts the
// sequence into n = 2*cp*m equal chunks and gives every rank 2m of them:
// equal token counts (the ring's blocks keep their shape), chunks assigned
// longest first to the least loaded rank with room, then improved by
// swapping a chunk of the most loaded rank with a lighter one of another
// rank while that lowers the pair's maximum. m is the smallest of 1, 2, 4,
// ... whose assignment is within kDocBalanceGoal of the mean, as long as a
// chunk keeps at least min_chunk tokens (smaller chunks mean more, smaller
// kernel calls); when none is, the most even one.
//
// The layout is a pure function of (doc ids, seq_len, cp, window,
// min_chunk): every rank computes the same one from the same sample, with no
// message. A rank's chunks are kept in sequence order and adjacent ones
// merged into one run.
#pragma once
#include <cstdint>
#include <vector>

#include "trident/parallel/cp/ring_attention.hpp"

namespace trident::cp {

// Stop doubling the chunk count once the most loaded rank is within 2% of
// the mean (the target is 10%).
inline constexpr double kDocBalanceGoal = 1.02;
// Chunks below one query tile of the kernel cost more in calls than they
// gain in balance.
inline constexpr int64_t kDocMinChunk = kernels::kQueryBlock;

// Visible (query, key) pairs of each query position: its distance to its
// document's start plus one, capped at window (> 0). doc_ids [seq_len],
// non-decreasing.
std::vector<int64_t> pairs_per_query(const int32_t* doc_ids, int64_t seq_len, int64_t window);

// The layout of one packed sequence over cp ranks (seq_len % (2*cp) == 0):
// runs[r] are rank r's runs, in local order, seq_len / cp tokens in all.
SeqLayout balance_documents(const int32_t* doc_ids, int64_t seq_len, int cp, int64_t window,
                            int64_t min_chunk = kDocMinChunk);

// Visible pairs of each rank's queries under `layout` (pairs: pairs_per_query).
std::vector<double> layout_pairs(const SeqLayout& layout, const std::vector<int64_t>& pairs);

// Global positions of a rank's runs, in local order.
std::vector<int64_t> run_positions(const std::vector<TokenRun>& runs);

}  // namespace trident::cp
