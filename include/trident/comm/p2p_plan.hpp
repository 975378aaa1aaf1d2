// Point-to-point plans: a collective written as grouped sends and receives,
// the form NCCL needs for an all-to-all-v (ncclSend/ncclRecv between
// ncclGroupStart and ncclGroupEnd). Host-side arithmetic only, so it is
// tested on the CPU; the device backend issues the plan.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace trident {

// One transfer: `bytes` bytes from/to `offset` bytes into the buffer.
struct P2pTransfer {
  int peer = 0;
  size_t offset = 0;
  size_t bytes = 0;
};

// An all-to-all-v as transfers. Empty blocks are left out (no zero-byte
// calls); the block a rank keeps is a local copy, not a message.
struct AlltoallvPlan {
  std::vector<P2pTransfer> sends, recvs;  // ascending peer order
  bool self_copy = false;
  size_t self_send_offset = 0, self_recv_offset = 0, self_bytes = 0;
};

// counts and displacements in elements of elem_bytes, one per rank (size
// entries). Throws Error on a negative count or displacement, or when the
// rank keeps a block whose send and receive sizes differ.
AlltoallvPlan alltoallv_plan(int rank, int size, const int64_t* send_counts,
                             const int64_t* send_displs, const int64_t* recv_counts,
                             const int64_t* recv_displs, size_t elem_bytes);

}  // namespace trident
