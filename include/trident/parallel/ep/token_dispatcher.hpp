// TokenDispatcher: moves token rows from the rank that holds the token to the
// rank that holds its expert (dispatch) and back (combine), by all-to-all-v
// over the ep communicator.
//
// Layout. On the source rank the k copies of T tokens are laid out
// expert-major (stable: token order within an expert), which is also
// destination-major because ep rank e holds experts [e*E/ep, (e+1)*E/ep).
// On the expert rank rows arrive source-major and, within one source, by
// local expert; chunk (src, local expert) says where each group lies, so an
// expert runs one GEMM per source chunk and nothing is copied again. No row
// is padded: bytes moved equal the routed copies times d floats.
//
// Backward uses the same two transfers the other way round: the gradient of
// the combine travels like a dispatch, the gradient of the dispatch like a
// combine.
#pragma once
#include <cstdint>
#include <vector>

#include "trident/comm/comm.hpp"

namespace trident::ep {

// Where the time of one layer's token exchange went (seconds, this rank),
// and the bytes this rank handed to its all-to-alls (rows kept on the rank
// included, so that it is exactly routed copies x d x 4; 0 without ep).
struct DispatchTimes {
  double count_exchange = 0, permute = 0, a2a = 0, expert = 0, combine = 0;
  double a2a_bytes = 0;
};

// Seconds on a steady clock, for the times above.
double ep_clock_s();

struct DispatchPlan {
  int64_t T = 0;
  int k = 0;
  int n_experts = 0, ep_size = 1, ep_rank = 0, local_experts = 0;
  std::vector<int64_t> row_of;      // [T*k]: row of copy (t, j) in the send buffer, -1 dropped
  std::vector<int64_t> send_token;  // [S]: token of each send row
  std::vector<int64_t> send_rows, send_displ;  // [ep] rows to each peer, and where they start
  std::vector<int64_t> recv_rows, recv_displ;  // [ep] rows from each peer
  std::vector<int64_t> chunk_rows, chunk_offset;  // [ep * local_experts], source-major
  std::vector<int64_t> tokens_per_expert;          // [E]: this rank's copies per global expert

  int64_t sent() const { return static_cast<int64_t>(send_token.size()); }
  int64_t received() const;
  int first_local_expert() const { return ep_rank * local_experts; }
};

class TokenDispatcher {
 public:
  // ep: nullptr or size 1 keeps every expert local (no communication).
  TokenDispatcher(Communicator* ep, int n_experts);

  // The expert-major permutation of the copies and the count exchange.
  // expert [T*k]: global expert of copy (t, j), -1 for a dropped copy.
  DispatchPlan plan(const int* expert, int64_t T, int k, DispatchTimes* times = nullptr) const;

  // send [S, d] (send order) -> recv [R, d] on the expert side.
  void to_experts(const DispatchPlan& p, const float* send, float* recv, int64_t d,
                  DispatchTimes* times = nullptr) const;
  // expert side [R, d] -> back [S, d] in send order on the source.
  void to_sources(const DispatchPlan& p, const float* expert_side, float* back, int64_t d,
                  DispatchTimes* times = nullptr) const;

  int ep_size() const { return ep_size_; }
  int ep_rank() const { return ep_rank_; }

 private:
  Communicator* ep_;
  int n_experts_, ep_size_, ep_rank_;
};

}  // namespace trident::ep
