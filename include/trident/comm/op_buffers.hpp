// The memory an operation reads and writes: what a device backend records as
// in use until the operation completes (kernels/buffer_uses.hpp), so that a
// buffer handed to a pending communication outlives it.
#pragma once
#include <cstddef>
#include <vector>

#include "trident/comm/comm.hpp"

namespace trident {

struct OpBuffer {
  const void* ptr;
  size_t bytes;
};

// op's input and output extents on a group of group_size ranks (bytes, a
// null or empty one left out): send: in; recv, broadcast, allreduce,
// reduce: out; allgather: in and every rank's block of out; reduce_scatter:
// every rank's block of in, and out; alltoallv: the furthest displacement
// plus count of each side; barrier: none.
std::vector<OpBuffer> op_buffers(const CommOp& op, int group_size);

}  // namespace trident
