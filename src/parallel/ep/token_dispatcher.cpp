// TokenDispatcher: count exchange, expert-major permutation plan, and the two
// all-to-all-v transfers of token rows (see the header for the layout).
#include "trident/parallel/ep/token_dispatcher.hpp"

#include <chrono>
#include <cstring>
#include <string>

#include "trident/core/error.hpp"

namespace trident::ep {

// Steady clock (not now_s): the layer also runs without MPI initialised.
double ep_clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t DispatchPlan::received() const {
  int64_t n = 0;
  for (auto r : recv_rows) n += r;
  return n;
}

TokenDispatcher::TokenDispatcher(Communicator* ep, int n_experts)
    : ep_(ep && ep->size() > 1 ? ep : nullptr),
      n_experts_(n_experts),
      ep_size_(ep_ ? ep_->size() : 1),
      ep_rank_(ep_ ? ep_->rank() : 0) {
  TRIDENT_CHECK(n_experts > 0 && n_experts % ep_size_ == 0,
                "n_experts " + std::to_string(n_experts) + " is not a multiple of ep " +
                    std::to_string(ep_size_));
}

DispatchPlan TokenDispatcher::plan(const int* expert, int64_t T, int k,
                                   DispatchTimes* times) const {
  const double t0 = ep_clock_s();
  DispatchPlan p;
  p.T = T;
  p.k = k;
  p.n_experts = n_experts_;
  p.ep_size = ep_size_;
  p.ep_rank = ep_rank_;
  p.local_experts = n_experts_ / ep_size_;
  const int E = n_experts_, L = p.local_experts, P = ep_size_;

  // Counting sort of the copies by expert, stable in (t, j): deterministic rows.
  p.tokens_per_expert.assign(E, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int e = expert[i];
    if (e < 0) continue;
    TRIDENT_CHECK(e < E, "expert id " + std::to_string(e) + " out of range");
    p.tokens_per_expert[e]++;
  }
  std::vector<int64_t> next(E, 0);
  for (int e = 1; e < E; ++e) next[e] = next[e - 1] + p.tokens_per_expert[e - 1];
  const int64_t S = E ? next[E - 1] + p.tokens_per_expert[E - 1] : 0;
  p.row_of.assign(static_cast<size_t>(T * k), -1);
  p.send_token.assign(static_cast<size_t>(S), 0);
  for (int64_t i = 0; i < T * k; ++i) {
    const int e = expert[i];
    if (e < 0) continue;
    const int64_t r = next[e]++;
    p.row_of[i] = r;
    p.send_token[r] = i / k;
  }
  p.send_rows.assign(P, 0);
  p.send_displ.assign(P, 0);
  for (int e = 0; e < E; ++e) p.send_rows[e / L] += p.tokens_per_expert[e];
  for (int r = 1; r < P; ++r) p.send_displ[r] = p.send_displ[r - 1] + p.send_rows[r - 1];

  // Count exchange: peer r gets this rank's counts for r's experts.
  const double t1 = ep_clock_s();
  p.chunk_rows.assign(static_cast<size_t>(P * L), 0);
  if (ep_) {
    ep_->alltoall(p.tokens_per_expert.data(), p.chunk_rows.data(), static_cast<size_t>(L));
  } else {
    p.chunk_rows = p.tokens_per_expert;
  }
  p.recv_rows.assign(P, 0);
  p.recv_displ.assign(P, 0);
  p.chunk_offset.assign(static_cast<size_t>(P * L), 0);
  int64_t off = 0;
  for (int r = 0; r < P; ++r) {
    p.recv_displ[r] = off;
    for (int e = 0; e < L; ++e) {
      p.chunk_offset[r * L + e] = off;
      off += p.chunk_rows[r * L + e];
      p.recv_rows[r] += p.chunk_rows[r * L + e];
    }
  }
  if (times) {
    const double t2 = ep_clock_s();
    times->permute += t1 - t0;  // the index sort is part of the permutation
    times->count_exchange += t2 - t1;
  }
  return p;
}

void TokenDispatcher::to_experts(const DispatchPlan& p, const float* send, float* recv, int64_t d,
                                 DispatchTimes* times) const {
  const double t0 = ep_clock_s();
  if (ep_) {
    ep_->alltoallv(send, p.send_rows, p.send_displ, recv, p.recv_rows, p.recv_displ,
                   sizeof(float) * static_cast<size_t>(d));
  } else if (p.sent() > 0) {
    std::memcpy(recv, send, sizeof(float) * static_cast<size_t>(p.sent() * d));
  }
  if (times) {
    times->a2a += ep_clock_s() - t0;
    if (ep_) times->a2a_bytes += double(p.sent()) * double(d) * sizeof(float);
  }
}

void TokenDispatcher::to_sources(const DispatchPlan& p, const float* expert_side, float* back,
                                 int64_t d, DispatchTimes* times) const {
  const double t0 = ep_clock_s();
  if (ep_) {
    ep_->alltoallv(expert_side, p.recv_rows, p.recv_displ, back, p.send_rows, p.send_displ,
                   sizeof(float) * static_cast<size_t>(d));
  } else if (p.sent() > 0) {
    std::memcpy(back, expert_side, sizeof(float) * static_cast<size_t>(p.sent() * d));
  }
  if (times) {
    times->a2a += ep_clock_s() - t0;
    if (ep_) times->a2a_bytes += double(p.received()) * double(d) * sizeof(float);
  }
}

}  // namespace trident::ep
