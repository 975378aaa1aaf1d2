// Float sums bracketed in group-rank order (SumOrder::rank) on MPI.
// Private to src/comm/mpi.
//
// MPI's reductions pick their algorithm, and so the bracketing of a sum over
// three or more ranks, by the operation and the message's size: an
// all-reduce of a buffer and a reduce-scatter of the same buffer can differ
// in the last bits. This one is a chain of point-to-point messages instead:
// rank 0 sends its data to rank 1, which adds its own and passes the partial
// sum on, ..., rank p-1 adds the last term, so every element is
// ((x_0 + x_1) + x_2) + ... + x_{p-1} whatever the operation, its size or
// the element's position. The sum then goes where the operation puts it:
// from rank p-1 to rank 0 and down the same chain to rank p-2 (all-reduce),
// or to the root (reduce) or to the block's owner (reduce-scatter).
//
// The data travels in chunks, up to kOrderedWindow of them in flight per
// rank, so the chain is pipelined: each link carries the data once in each
// phase (a ring all-reduce carries (p-1)/p of it twice), and the latency is
// 2(p-1) hops of one chunk. poll() moves the chain on; as with MPI's own
// non-blocking collectives, it advances while the ranks poll or wait.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>

#include "trident/comm/comm.hpp"

namespace trident::detail {

// Chunks in flight per rank; each has two tags (sum, result).
constexpr int kOrderedWindow = 4;
constexpr int kOrderedTagsPerOp = 2 * kOrderedWindow;

struct OrderedSumArgs {
  enum class Mode { all, root, scatter };
  MPI_Comm comm = MPI_COMM_NULL;  // used for this operation's messages only
  int rank = 0, size = 1;
  int tag_base = 0;  // tags [tag_base, tag_base + kOrderedTagsPerOp) are this operation's
  Mode mode = Mode::all;
  // all: n elements in place (in == out allowed); root: the same, the sum
  // lands in root's out; scatter: in holds size blocks of `block` elements,
  // out (not overlapping in) receives this rank's block of the sum.
  const float* in = nullptr;
  float* out = nullptr;
  size_t n = 0;
  size_t block = 0;
  int root = 0;
};

std::unique_ptr<PendingOp> post_ordered_sum(const OrderedSumArgs& a);

}  // namespace trident::detail
