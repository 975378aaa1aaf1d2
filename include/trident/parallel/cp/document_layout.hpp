// parallel.cp_layout = "docs": a cp layout chosen per sequence from its
// packed documents, so that every rank of the ring computes the same number
// of (query, key) pairs.
//
// Zig-zag balances the causal triangle of one sequence. A packed sequence's
// work is the sum of its documents' triangles (a query sees the keys of its
// own document up to itself, at most model.window of them), wherever the
// documents fall, so zig-zag leaves one rank with a long document's triangle.
// The document layout cuts the sequence into n = 2*cp*m equal chunks and
// gives every rank 2m of them: equal token counts (the ring's blocks keep
// their shape). Chunks are assigned most expensive first to the cheapest
// rank with room, then improved by swapping a chunk of the most expensive
// rank with a cheaper one of another rank while that lowers the pair's
// maximum; a chunk's price is either its queries' visible pairs or the
// modelled time of their kernel calls (RingWork below: visible pairs are not
// enough, a partially visible tile costs more per pair than a full one).
// Of the two assignments for each of m = 1, 2, 4, ... (while a chunk keeps
// at least min_chunk tokens), those whose most loaded rank's visible pairs
// are within kDocFlopGoal of the mean compete on their slowest rank's
// modelled time over the ring's actual calls; when none is, the most even
// in pairs is taken.
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

// The most loaded rank's visible pairs (its attention FLOPs) at most 10%
// over the mean (the target); within that, time decides.
inline constexpr double kDocFlopGoal = 1.10;
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

// What the ring's kernel calls cost one rank, per head: a model of the CPU
// kernel's tiling (kernels/cpu/attention.cpp, share/trident/cpu-kernels.md).
// Per query block of kQueryBlock rows the kernel sweeps the keys a block can
// see in tiles of kKeyBlock; a tile no row sees is skipped, the others run
// GEMMs over "pieces" (the whole tile, or, when that computes more than 1/8
// of it in vain, bands of 32 rows), then per-row softmax passes. Visible
// pairs alone miss the time a partially visible tile costs beyond its pairs:
// the masked pairs inside its pieces, the GEMM calls of a cut diagonal, the
// row passes and the calls themselves.
struct RingWork {
  double visible = 0;    // visible (query, key) pairs
  double computed = 0;   // pairs the GEMM pieces compute (visible and masked)
  double pieces = 0;     // GEMM pieces (each: 2 GEMMs forward, 5 backward)
  double tile_rows = 0;  // rows of the non-empty tiles (row passes, interval search)
  double calls = 0;      // kernel calls (one per (query tile, key run) not skipped)
  RingWork& operator+=(const RingWork& o);
  // Forward + backward time in units of one computed pair (kTileCost).
  double cost() const;
};

// The time of the rest in computed pairs, forward + backward: least squares
// through the origin over every rank's measured compute in `trident bench
// ring --docs lognormal --docs-seeds 12 --per-rank --layout all` (cp 4, seq
// 8192, 4 heads, head_dim 64; ring-attention.md, "Pricing tile time"). A
// GEMM piece costs about 1400 computed pairs, a call (all 4 heads) about
// 5000; the row passes showed no cost beyond their tile's computed pairs.
// Residual rms 4.3% of a rank's time, against 16% for visible pairs alone.
struct TileCostModel {
  double piece, tile_row, call;
};
inline constexpr TileCostModel kTileCost{1400, 0, 5000};

// The work of one kernel call (one head) on shape s, whose document ids are
// host memory; Tq <= kQueryBlock need not hold.
RingWork call_work(const kernels::AttnShape& s);

// The work of every rank of the causal ring under `layout` for one sequence
// of seq_len tokens: the kernel calls the ring makes (each rank's query
// tiles against each block's key runs, skipping pairs without a visible
// pair). doc_ids [seq_len] (nullptr: one document), window as model.window.
std::vector<RingWork> ring_work(const SeqLayout& layout, const int32_t* doc_ids, int64_t seq_len,
                                int64_t window);

}  // namespace trident::cp
