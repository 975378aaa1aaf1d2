// All-to-all-v as grouped point-to-point transfers (the device backend's
// form of the MoE token exchange).
#include "trident/comm/p2p_plan.hpp"

#include <string>

#include "trident/core/error.hpp"

namespace trident {

AlltoallvPlan alltoallv_plan(int rank, int size, const int64_t* send_counts,
                             const int64_t* send_displs, const int64_t* recv_counts,
                             const int64_t* recv_displs, size_t elem_bytes) {
  TRIDENT_CHECK(rank >= 0 && rank < size, "alltoallv plan: rank outside the group");
  AlltoallvPlan plan;
  for (int p = 0; p < size; ++p) {
    const size_t i = size_t(p);
    TRIDENT_CHECK(
        send_counts[i] >= 0 && send_displs[i] >= 0 && recv_counts[i] >= 0 && recv_displs[i] >= 0,
        "alltoallv plan: negative count or displacement for peer " + std::to_string(p));
    const P2pTransfer out{p, size_t(send_displs[i]) * elem_bytes,
                          size_t(send_counts[i]) * elem_bytes};
    const P2pTransfer in{p, size_t(recv_displs[i]) * elem_bytes,
                         size_t(recv_counts[i]) * elem_bytes};
    if (p == rank) {
      TRIDENT_CHECK(out.bytes == in.bytes, "alltoallv plan: rank " + std::to_string(p) + " keeps " +
                                               std::to_string(send_counts[i]) +
                                               " elements but expects " +
                                               std::to_string(recv_counts[i]));
      plan.self_copy = out.bytes > 0;
      plan.self_send_offset = out.offset;
      plan.self_recv_offset = in.offset;
      plan.self_bytes = out.bytes;
      continue;
    }
    if (out.bytes > 0) plan.sends.push_back(out);
    if (in.bytes > 0) plan.recvs.push_back(in);
  }
  return plan;
}

}  // namespace trident
