// TokenDispatcher: moves token rows from the rank that holds the token to the
// rank that holds its expert (dispatch) and brings the experts' rows back,
// reduced over each token's k copies (combine), over the ep communicator.
//
// Layout. On the source rank the k copies of T tokens are ordered
// expert-major (stable: token order within an expert), which is also
// destination-major because ep rank e holds experts [e*E/ep, (e+1)*E/ep).
// On the expert rank the rows of each local expert are contiguous (local
// experts in order; within one, source ranks in order, each source's rows in
// its send order): chunk (src, local expert) says where each group lies, and
// an expert's rows are the one block a grouped GEMM takes. No row is padded:
// bytes moved equal the routed copies times d floats.
//
// The permutation is an index plan (DispatchPlan) computed once per routing;
// permute and unpermute are then the MoE row ops on tensors
// (kernels/functional.hpp: gather_rows, combine_rows). Every call takes and
// returns tensors; the transports' buffers (shared windows, send and
// receive buffers) appear as tensor views of them (Tensor::borrow,
// src/parallel/ep/row_views.hpp). How rows
// travel is a Transport (transport.hpp), chosen once at construction from
// runtime.ep_transport: local (ep = 1), alltoallv or shm; all give the same
// results bit for bit.
//
// The layer's forward keeps its expert-side rows until its backward
// (ForwardRows); the other transfers (dispatch, dispatch_rows, combine: the
// backward's) are transient. Backward uses the same primitives: the
// gradient of the combine travels like a dispatch (dispatch_rows), the
// gradient of the dispatch comes back like a combine (combine with an empty
// weight).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"
#include "trident/core/profiler.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/functional.hpp"

namespace trident::ep {

// What the dispatcher reports to a profiler sink (set_profiler), per call:
// spans "ep.count" (count exchange), "ep.permute" (index plan and gathers
// outside a transfer), "ep.dispatch" and "ep.return" (the transfers to the
// experts and back), "ep.combine" (the unpermute); counter "ep.bytes": the
// rows of the transfers in bytes (rows kept on the rank included, so that
// one direction is exactly routed copies x d x 4; 0 without ep). The ep
// communicator counters (Communicator::counters) see only the bytes that leave the
// rank.

enum class EpTransport { local, alltoallv, shm };
const char* ep_transport_name(EpTransport t);

struct DispatchPlan {
  int64_t T = 0;
  int k = 0;
  int n_experts = 0, ep_size = 1, ep_rank = 0, local_experts = 0;
  // The index data the kernels read, on the dispatcher's device:
  Tensor row_of;      // i64 [T*k]: row of copy (t, j) in send order, -1 dropped
  Tensor send_token;  // i64 [S]: token of each send row
  // The sizes the transfers need, on the host (from the one small copy of
  // the counts per plan):
  std::vector<int64_t> send_rows, send_displ;     // [ep] rows to each peer, and where they start
  std::vector<int64_t> recv_rows;                 // [ep] rows from each peer
  std::vector<int64_t> chunk_rows, chunk_offset;  // [ep * local_experts], indexed src * L + e
  std::vector<int64_t> tokens_per_expert;         // [E]: this rank's copies per global expert
  std::vector<int64_t> expert_first;  // [E + 1]: where each expert's rows start in send order
  std::vector<int64_t> counts;        // [ep * E]: every rank's tokens_per_expert
  std::vector<int64_t> expert_at;     // [E]: where this rank's rows for expert g start
                                      //      on g's expert rank (its expert side)
  std::vector<int64_t> rows_at;       // [ep]: rows each expert rank receives (its R)

  int64_t sent() const { return expert_first.empty() ? 0 : expert_first.back(); }
  int64_t received() const;
  int first_local_expert() const { return ep_rank * local_experts; }
};

// The experts' rows of this rank's copies, kept after a transient combine
// (in send order) so that a later combine or combine_backward given the
// same filled keep reads them again without communicating.
struct KeptRows {
  bool filled = false;
  Tensor rows;  // [S, d] (or more: grown, never shrunk)
};

// The expert-side rows of one forward: inputs [R, d] as dispatched and the
// experts' outputs [R, d], alive until destroyed (after the backward), and
// once combine_forward has brought them back, this rank's copies' output
// rows in send order (returned(): one block [S, d], or one block per
// expert where the rows stay where the experts wrote them). Made by a
// Transport; the tensors are views of its buffers (shared windows under
// shm), valid while this object lives.
class ForwardRows {
 public:
  virtual ~ForwardRows() = default;
  ForwardRows(const ForwardRows&) = delete;
  ForwardRows& operator=(const ForwardRows&) = delete;
  const Tensor& in() const { return in_; }
  const Tensor& out() const { return out_; }
  const kernels::RowBlocks& returned() const;

 protected:
  ForwardRows() = default;
  Tensor in_, out_;  // [R, d] each
  kernels::RowBlocks returned_;
  bool back_ = false;  // returned_ is valid
};

class Transport;

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
                  double shm_limit_bytes = 0, const kernels::Ctx& ctx = {});
  ~TokenDispatcher();
  TokenDispatcher(const TokenDispatcher&) = delete;
  TokenDispatcher& operator=(const TokenDispatcher&) = delete;

  // The expert-major permutation of the copies and the count exchange (an
  // all-gather of every rank's per-expert counts).
  // expert i32 [T*k] on the dispatcher's device: global expert of copy
  // (t, j), -1 for a dropped copy. The per-expert counts come to the host
  // (one small copy); the index data stays on the device.
  DispatchPlan plan(const Tensor& expert, int64_t T, int k);
  // The same from host values (tests and benchmarks): uploaded first.
  DispatchPlan plan(const std::vector<int>& expert, int64_t T, int k);

  // Every tensor below is f32 on the dispatcher's device, rows of d = the
  // last dimension (x, y, dy: [T, d]; expert_in, expert_side: [R, d];
  // rows, drows: [S, d]; weight, dweight: [T*k], weight empty: all 1).
  // A caller that holds raw buffers wraps them with Tensor::borrow.

  // Dispatch: the rows x[send_token[r]] to the expert side expert_in in
  // chunk layout. Collective over ep.
  void dispatch(const DispatchPlan& p, const Tensor& x, const Tensor& expert_in);
  // The same for rows already in send order.
  void dispatch_rows(const DispatchPlan& p, const Tensor& rows, const Tensor& expert_in);
  // rows [S, d] in send order on the expert side [R, d]: dispatch_rows into
  // a new tensor, or, where the send order is the expert side (the local
  // transport: ep = 1), rows itself (nothing is copied). Collective over ep.
  Tensor to_expert_side(const DispatchPlan& p, const Tensor& rows);
  // y[t] = sum_j weight[t*k+j] * row(t, j), in j order, row(t, j) being
  // copy (t, j)'s row of expert_side: the combine, and with an empty weight
  // the backward of the dispatch. keep: the rows that came back are left
  // there in send order, and a later call given the same filled keep reads
  // them without communicating (on every rank alike, so still in step).
  // Collective over ep otherwise.
  void combine(const DispatchPlan& p, const Tensor& expert_side, const Tensor& weight,
               const Tensor& y, KeptRows* keep = nullptr);
  // Backward of combine (functional.hpp's combine_rows_backward on the rows
  // that come back): drows in send order, dweight. Same keep rules.
  void combine_backward(const DispatchPlan& p, const Tensor& expert_side, const Tensor& dy,
                        const Tensor& weight, const Tensor& drows, const Tensor& dweight,
                        KeptRows* keep = nullptr);

  // The layer's forward: dispatch into rows that live until the backward
  // (in(): the expert inputs), experts write out(), combine_forward() sums
  // them back, and the backward reads them again with combine_backward().
  // dispatch_forward and combine_forward are collective over ep;
  // combine_backward on ForwardRows is not.
  std::unique_ptr<ForwardRows> dispatch_forward(const DispatchPlan& p, const Tensor& x);
  // Where the send order is the expert side (ep = 1): x's rows gathered
  // straight into expert_in [R, d] (f32 or bf16), rows.in() left unfilled;
  // elsewhere nullptr (use dispatch_forward). Not collective.
  std::unique_ptr<ForwardRows> dispatch_forward_into(const DispatchPlan& p, const Tensor& x,
                                                     const Tensor& expert_in);
  void combine_forward(const DispatchPlan& p, ForwardRows& rows, const Tensor& weight,
                       const Tensor& y);
  void combine_backward(const DispatchPlan& p, const ForwardRows& rows, const Tensor& dy,
                        const Tensor& weight, const Tensor& drows, const Tensor& dweight);

  // Spans and counters of every later call go to sink (nullptr: none).
  void set_profiler(prof::Sink* sink);

  int ep_size() const { return ep_size_; }
  int ep_rank() const { return ep_rank_; }
  EpTransport transport() const;
  // Bytes of shared memory this dispatcher's blocks hold, all ranks together.
  double shm_bytes() const;
  // How often the shared blocks grew; each growth sends one int of ep
  // traffic (the ranks agree that /dev/shm has room).
  int shm_growths() const;
  // Why auto chose (or fell back to) alltoallv ("" otherwise).
  const std::string& transport_reason() const;

 private:
  // The unpermute (functional.hpp's combine_rows) of rows that came back,
  // and its backward.
  void unpermute(const DispatchPlan& p, const kernels::RowBlocks& rows, const Tensor& weight,
                 const Tensor& y);
  void unpermute_backward(const DispatchPlan& p, const kernels::RowBlocks& rows, const Tensor& dy,
                          const Tensor& weight, const Tensor& drows, const Tensor& dweight);

  Communicator* ep_;
  int n_experts_, ep_size_, ep_rank_;
  kernels::Ctx ctx_;
  prof::Sink* sink_ = nullptr;
  std::unique_ptr<Transport> transport_;
};

}  // namespace trident::ep
