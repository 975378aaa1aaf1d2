// The extents of an operation's buffers (comm/op_buffers.hpp).
#include "trident/comm/op_buffers.hpp"

#include <algorithm>
#include <cstdint>

namespace trident {
namespace {

// The bytes from an all-to-all-v side's start to the end of its furthest block.
size_t alltoallv_extent(const int64_t* counts, const int64_t* displs, int n, size_t elem) {
  int64_t end = 0;
  for (int r = 0; counts && displs && r < n; ++r)
    if (counts[r] > 0) end = std::max(end, displs[r] + counts[r]);
  return size_t(end) * elem;
}

}  // namespace

std::vector<OpBuffer> op_buffers(const CommOp& op, int group_size) {
  using Kind = CommOp::Kind;
  const size_t n = size_t(group_size), typed = op.count * elem_size(op.type);
  std::vector<OpBuffer> out;
  switch (op.kind) {
    case Kind::send:
      out = {{op.in, op.bytes}};
      break;
    case Kind::recv:
    case Kind::broadcast:
      out = {{op.out, op.bytes}};
      break;
    case Kind::allreduce:
    case Kind::reduce:
      out = {{op.out, typed}};
      break;
    case Kind::allgather:
      out = {{op.in, op.bytes}, {op.out, op.bytes * n}};
      break;
    case Kind::reduce_scatter:
      out = {{op.in, typed * n}, {op.out, typed}};
      break;
    case Kind::alltoallv:
      out = {{op.in, alltoallv_extent(op.send_counts, op.send_displs, group_size, op.elem_bytes)},
             {op.out, alltoallv_extent(op.recv_counts, op.recv_displs, group_size, op.elem_bytes)}};
      break;
    case Kind::barrier:
      break;
  }
  std::erase_if(out, [](const OpBuffer& b) { return b.ptr == nullptr || b.bytes == 0; });
  return out;
}

}  // namespace trident
