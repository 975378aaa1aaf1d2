// Float sums bracketed in group-rank order (SumOrder::rank) on MPI.
// Private to src/comm/mpi.
//
// MPI's reductions pick their algorithm, and so the bracketing of a sum over
// three or more ranks, by the operation and the message's size: an
// all-reduce of a buffer and a reduce-scatter of the same buffer can differ
// in the last bits. This one is built of point-to-point messages instead,
// and every element is ((x_0 + x_1) + x_2) + ... + x_{p-1} whatever the
// operation, its size or the element's position.
//
// Each rank owns a part of the data and sums it: every rank sends each
// other rank its terms of that rank's part, the owner adds the p terms in
// rank order, and the sums go where the operation puts them: to every rank
// (all-reduce), to the root (reduce); a reduce-scatter's parts are the
// blocks, already with their owners. A rank so sends (p-1)/p of the data
// per phase, as a ring all-reduce does (the chain this replaced, rank 0 to
// rank 1 to ... rank p-1, carried all of it over each link in each phase),
// and the latency is two rounds of messages, not 2(p-1) hops.
//
// The data goes in chunks of p parts (at least 1Ki floats a part; a smaller
// sum is owned by fewer ranks), up to kOrderedWindow chunks in flight per
// rank. poll() moves the exchange on; as with MPI's own non-blocking
// collectives, it advances while the ranks poll or wait.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>

#include "trident/comm/comm.hpp"

namespace trident::detail {

// Chunks in flight per rank; each has two tags (terms, sums).
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
