// TokenDispatcher: moves token rows from the rank that holds the token to the
// rank that holds its expert (dispatch) and brings the experts' rows back,
// reduced over each token's k copies (combine), over the ep communicator.
//
// Layout. On the source rank the k copies of T tokens are ordered
// expert-major (stable: token order within an expert), which is also
// destination-major because ep rank e holds experts [e*E/ep, (e+1)*E/ep).
// On the expert rank rows arrive source-major and, within one source, by
// local expert; chunk (src, local expert) says where each group lies, so an
// expert runs one GEMM per source chunk and nothing is copied again. No row
// is padded: bytes moved equal the routed copies times d floats.
//
// Two transports, the same results bit for bit:
//  - alltoallv: gather the rows into a send buffer, MPI all-to-all-v, and on
//    the way back all-to-all-v into a buffer that the combine then reads.
//  - shm (all ep ranks on one node, as the mesh puts them): shared memory
//    (SharedWindow) that every rank maps. A source writes the rows for each
//    expert rank straight from x into that rank's inbox (the permutation is
//    the copy); experts read their inputs there and write their outputs
//    into their outbox; a source sums its copies' rows where they lie in
//    the peers' outboxes (the combine is the copy). Each transfer is write,
//    fence (a barrier with memory syncs), read.
//
// The layer's forward keeps its expert-side rows until its backward
// (ForwardRows): with shm they stay in a shared slot, so neither are the
// expert inputs copied out of the inbox nor the returned rows kept by the
// source; the backward reads the outboxes again where they lie. A slot is
// reused only after a collective has followed its release, so no peer can
// still be reading it; slots grow (collectively, decided from the counts
// that every rank has) when a step needs more, and if /dev/shm cannot hold
// them every rank falls back to alltoallv together. The other transfers
// (dispatch, dispatch_rows, visit_back, combine: the backward's) use one
// transient window: a box some peer may still be reading is fenced before
// anyone writes it again, unless a collective has ordered everything since.
//
// Backward uses the same primitives: the gradient of the combine travels
// like a dispatch (dispatch_rows), the gradient of the dispatch comes back
// like a combine (combine with weights 1).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"

namespace trident {
class SharedWindow;
}

namespace trident::ep {

// Where the time of one layer's token exchange went (seconds, this rank),
// and the rows of its transfers in bytes (rows kept on the rank included, so
// that one direction is exactly routed copies x d x 4; 0 without ep). The ep
// counters (comm_counters) see only the bytes that leave the rank.
struct DispatchTimes {
  double count_exchange = 0, permute = 0, a2a = 0, expert = 0, combine = 0;
  double a2a_bytes = 0;
};

// Seconds on a steady clock, for the times above.
double ep_clock_s();

enum class EpTransport { alltoallv, shm };
const char* ep_transport_name(EpTransport t);

struct DispatchPlan {
  int64_t T = 0;
  int k = 0;
  int n_experts = 0, ep_size = 1, ep_rank = 0, local_experts = 0;
  std::vector<int64_t> row_of;      // [T*k]: row of copy (t, j) in send order, -1 dropped
  std::vector<int64_t> send_token;  // [S]: token of each send row
  std::vector<int64_t> send_rows, send_displ;     // [ep] rows to each peer, and where they start
  std::vector<int64_t> recv_rows, recv_displ;     // [ep] rows from each peer
  std::vector<int64_t> chunk_rows, chunk_offset;  // [ep * local_experts], source-major
  std::vector<int64_t> tokens_per_expert;         // [E]: this rank's copies per global expert
  std::vector<int64_t> counts;                    // [ep * E]: every rank's tokens_per_expert
  std::vector<int64_t> peer_offset;  // [ep]: where this rank's rows start on each expert rank
  std::vector<int64_t> rows_at;      // [ep]: rows each expert rank receives (its R)

  int64_t sent() const { return static_cast<int64_t>(send_token.size()); }
  int64_t received() const;
  int first_local_expert() const { return ep_rank * local_experts; }
  // Send rows of ep rank r start at send_displ[r] on this rank; on rank r
  // they lie at peer_offset[r] + (row - send_displ[r]).
  int peer_of_row(int64_t row) const;
};

// Called for each token t = 0..T-1 in order with the k rows of its copies
// (rows[j]: d floats of copy (t, j), nullptr when the copy was dropped).
// The pointers are valid during the call only.
using CopyVisitor = std::function<void(int64_t t, const float* const* rows)>;

// The experts' rows of this rank's copies, kept after an alltoallv combine
// (in send order) so that the backward can visit them again locally.
struct KeptRows {
  bool filled = false;
  std::vector<float> rows;  // [S, d]
};

class SlotPool;

// The expert-side rows of one forward: inputs [R, d] as dispatched and the
// experts' outputs [R, d], alive until destroyed (after the backward).
class ForwardRows {
 public:
  ForwardRows() = default;
  ~ForwardRows();
  ForwardRows(const ForwardRows&) = delete;
  ForwardRows& operator=(const ForwardRows&) = delete;
  float* in() { return in_; }
  float* out() { return out_; }

 private:
  friend class TokenDispatcher;
  float *in_ = nullptr, *out_ = nullptr;
  std::shared_ptr<SlotPool> pool_;  // shm: the slot's owner
  int slot_ = -1;
  std::vector<float> own_in_, own_out_;  // alltoallv, or no ep
  KeptRows kept_;                        // alltoallv: the rows back on the source
};

class TokenDispatcher {
 public:
  // ep: nullptr or size 1 keeps every expert local (no communication).
  // transport: alltoallv, shm or automatic (shm when every ep rank is on
  // this node, else alltoallv). Collective over ep. shm across nodes is an
  // InputError naming runtime.ep_transport.
  // shm_limit_bytes: the most shared memory this dispatcher's blocks may
  // hold, all ranks together (runtime.ep_shm_limit_mb; 0: only /dev/shm's
  // free space limits it). Past it, every rank falls back to alltoallv.
  TokenDispatcher(Communicator* ep, int n_experts,
                  EpTransportChoice transport = EpTransportChoice::automatic,
                  double shm_limit_bytes = 0);
  ~TokenDispatcher();
  TokenDispatcher(const TokenDispatcher&) = delete;
  TokenDispatcher& operator=(const TokenDispatcher&) = delete;

  // The expert-major permutation of the copies and the count exchange (an
  // all-gather of every rank's per-expert counts).
  // expert [T*k]: global expert of copy (t, j), -1 for a dropped copy.
  DispatchPlan plan(const int* expert, int64_t T, int k, DispatchTimes* times = nullptr) const;

  // Dispatch: the rows x[send_token[r]] (x: [T, d]) to the expert side
  // expert_in [R, d] in chunk layout. Collective over ep.
  void dispatch(const DispatchPlan& p, const float* x, float* expert_in, int64_t d,
                DispatchTimes* times = nullptr) const;
  // The same for rows already in send order (rows [S, d]).
  void dispatch_rows(const DispatchPlan& p, const float* rows, float* expert_in, int64_t d,
                     DispatchTimes* times = nullptr) const;
  // Combine side: fn sees, token by token, the expert-side rows
  // (expert_side [R, d] on each expert rank) of this rank's copies.
  // keep: the rows that came back are left there in send order, and a
  // later call given the same filled keep visits them without communicating
  // (on every rank alike, so still in step). Collective over ep otherwise.
  void visit_back(const DispatchPlan& p, const float* expert_side, int64_t d, const CopyVisitor& fn,
                  KeptRows* keep = nullptr, DispatchTimes* times = nullptr) const;
  // y[t] = sum_j weight[t*k+j] * row(t, j) (weight nullptr: 1), in j order:
  // the combine, and with weight nullptr the backward of the dispatch.
  void combine(const DispatchPlan& p, const float* expert_side, const float* weight, float* y,
               int64_t d, KeptRows* keep = nullptr, DispatchTimes* times = nullptr) const;

  // The layer's forward: dispatch into rows that live until the backward
  // (in(): the expert inputs), experts write out(), combine_forward() sums
  // them back, and the backward visits them again with visit_forward().
  // dispatch_forward and combine_forward are collective over ep;
  // visit_forward is not.
  std::unique_ptr<ForwardRows> dispatch_forward(const DispatchPlan& p, const float* x, int64_t d,
                                                DispatchTimes* times = nullptr) const;
  void combine_forward(const DispatchPlan& p, ForwardRows& rows, const float* weight, float* y,
                       int64_t d, DispatchTimes* times = nullptr) const;
  void visit_forward(const DispatchPlan& p, ForwardRows& rows, int64_t d,
                     const CopyVisitor& fn) const;

  int ep_size() const { return ep_size_; }
  int ep_rank() const { return ep_rank_; }
  EpTransport transport() const { return transport_; }
  // Bytes of shared memory this dispatcher's blocks hold, all ranks together.
  double shm_bytes() const;
  // How often the shared blocks grew; each growth sends one int of ep
  // traffic (the ranks agree that /dev/shm has room).
  int shm_growths() const { return growths_; }
  // Why auto chose (or fell back to) alltoallv ("" otherwise).
  const std::string& transport_reason() const { return reason_; }

 private:
  // Grows the shared blocks to hold R rows of d floats twice on every rank;
  // false (on every rank) when /dev/shm cannot: the transport is then
  // alltoallv from here on.
  bool shm_reserve(const DispatchPlan& p, int64_t d) const;
  // Collective: whether replacing blocks of `old_bytes` (all ranks) by
  // `new_bytes` keeps within /dev/shm and the limit; every rank gets the
  // same answer. Counts as a growth.
  bool shm_room(double old_bytes, double new_bytes) const;
  // Makes w hold an inbox and an outbox of R_r rows of d floats on every
  // rank r (collective when it must grow); false when there is no room.
  bool fit_window(std::unique_ptr<SharedWindow>& w, const DispatchPlan& p, int64_t d) const;
  void fall_back() const;  // alltoallv from here on, on every rank alike
  void dispatch_shm(const DispatchPlan& p, const float* src, bool indexed, float* expert_in,
                    int64_t d, DispatchTimes* times) const;
  void visit_back_shm(const DispatchPlan& p, const float* expert_side, int64_t d,
                      const CopyVisitor& fn, KeptRows* keep, DispatchTimes* times) const;
  void account(double bytes) const;
  void visit_rows(const DispatchPlan& p, const float* const* base, const CopyVisitor& fn,
                  int64_t d) const;

  Communicator* ep_;
  int n_experts_, ep_size_, ep_rank_;
  mutable EpTransport transport_ = EpTransport::alltoallv;
  mutable std::string reason_;
  mutable std::unique_ptr<SharedWindow> window_;  // transfers that keep nothing
  std::shared_ptr<SlotPool> slots_;               // forwards that keep their rows
  mutable int growths_ = 0;
  double shm_limit_ = 0;
  // A box some peer may still be reading (no collective since its last read).
  mutable bool inbox_busy_ = false, outbox_busy_ = false;
  void synced() const;                // after a collective: no peer still reads a box
  void fence(SharedWindow& w) const;  // w.fence(), then synced()
  // Workspaces reused from call to call: a fresh buffer per layer would
  // page-fault and zero its memory every time.
  mutable std::vector<float> send_;  // alltoallv: rows gathered for sending
  mutable std::vector<float> back_;  // alltoallv: rows back when the caller keeps none
};

}  // namespace trident::ep
