// Transport: how the rows of a TokenDispatcher travel between the source
// ranks and the expert ranks (layout in token_dispatcher.hpp). One
// implementation per way of moving them, chosen once by make_transport:
//
//  - local: ep = 1; the expert side is the send order, nothing travels.
//  - alltoallv: rows gathered into a send buffer, all-to-all-v over the ep
//    communicator, then put in expert order (an index gather) on the expert
//    side; the way back is the reverse.
//  - shm (all ep ranks on one node, as the mesh puts them): shared memory
//    (SharedWindow) that every rank maps. A source writes the rows for each
//    expert straight from x into its place in the expert rank's inbox (the
//    permutation is the copy); experts read their inputs there and write
//    their outbox; a source reads its copies' rows where they lie in the
//    peers' outboxes (the unpermute is the copy). Each transfer is write,
//    fence (a barrier with memory syncs), read. Forwards that keep their
//    rows hold a shared slot until the ForwardRows is destroyed; a slot is
//    reused only after a collective has followed its release. When
//    /dev/shm (or runtime.ep_shm_limit_mb) cannot hold a step's blocks,
//    every rank falls back to alltoallv together.
//
// On a device the alltoallv transport's communicator moves device buffers
// (NCCL: grouped send/recv on a communication stream; MPI: staged).
//
// Local steps and exchange steps. A transfer is a local step (permute:
// the rows gathered into send order; unpermute: the TokenDispatcher's
// combine of the rows that came back) and an exchange step posted by
// start_dispatch / start_return and completed by Exchange::wait(). Between
// the two the caller may compute: the blocking calls below (dispatch,
// gather_back, dispatch_forward, return_forward) post, call
// overlap::in_flight() (core/overlap.hpp: inside DualPipeV's overlapped
// pair the other micro-batch computes there; elsewhere nothing happens),
// then wait. Every rank of ep posts its exchanges in the same order; the
// two lanes of a pair tag their messages apart (overlap::lane()).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "trident/parallel/ep/token_dispatcher.hpp"

namespace trident::ep {

// Rows in send order as a transport reads them: row i is rows[index[i]]
// (a permute from the token rows [T, d]; index i64 [S] on the transport's
// device) or rows[i] (index empty: rows [S, d] already in send order).
struct SendRows {
  Tensor rows;
  Tensor index;
};

// An exchange that a start_* call posted. wait() completes it: the rows are
// then where start_* was told to put them. Collective over ep like the
// start. One dropped without a wait (an exception unwinding) is abandoned:
// its requests are cancelled.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void wait() = 0;
};

// An Exchange whose completion is a function (run once).
class DeferredExchange final : public Exchange {
 public:
  explicit DeferredExchange(std::function<void()> complete) : complete_(std::move(complete)) {}
  void wait() override {
    if (complete_) std::exchange(complete_, {})();
  }

 private:
  std::function<void()> complete_;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual EpTransport kind() const = 0;
  // Why auto chose, or the transport fell back to, alltoallv ("" otherwise).
  const std::string& reason() const { return reason_; }
  void set_reason(std::string why) { reason_ = std::move(why); }
  // Shared memory the transport's blocks hold (all ep ranks together) and
  // how often they grew: the shm transport's; zero for the others.
  struct SharedMemoryUse {
    double bytes = 0;
    int growths = 0;
  };
  const SharedMemoryUse& shared_memory() const { return shared_; }

  // Spans and counters go to sink (see TokenDispatcher); nullptr: none.
  virtual void set_profiler(prof::Sink* sink) { sink_ = sink; }

  // The count exchange (a collective of every ep rank) has just completed:
  // nothing a peer did before it is still in progress.
  virtual void synced() {}

  // Every row tensor is f32 [n, d] on the transport's device; d is the
  // last dimension. The implementations move the bytes behind the views
  // (MPI or NCCL buffers, shared windows); nothing here takes a pointer.

  // Local step: the rows of the send order, contiguous [S, d] (src.rows
  // itself when it has no index, else gathered into a buffer of the
  // transport's, valid until the next permute). The same for every
  // transport.
  Tensor permute(const DispatchPlan& p, const SendRows& src);
  // Exchange step: posts the rows of the send order (contiguous [S, d],
  // from permute) to the expert side expert_in [R, d] (chunk layout).
  virtual std::unique_ptr<Exchange> start_dispatch(const DispatchPlan& p, const Tensor& rows,
                                                   const Tensor& expert_in) = 0;

  // Exchange step back: posts the expert side's rows [R, d] to their
  // sources; once waited for, back [S, d] holds this rank's copies' rows in
  // send order (for the unpermute).
  virtual std::unique_ptr<Exchange> start_return(const DispatchPlan& p, const Tensor& expert_side,
                                                 const Tensor& back) = 0;

  // permute, start_dispatch, overlap::in_flight(), wait. Collective over ep.
  virtual void dispatch(const DispatchPlan& p, const SendRows& src, const Tensor& expert_in) = 0;
  // The rows of expert_side [R, d] that belong to this rank's copies, in
  // send order (one block [S, d], or one per expert where they lie in
  // shared memory), valid until the next call on this transport (or, with
  // keep, as long as keep). Collective over ep unless keep is filled.
  virtual kernels::RowBlocks gather_back(const DispatchPlan& p, const Tensor& expert_side,
                                         KeptRows* keep) = 0;

  // A forward that keeps its rows: x's rows [T, d] dispatched into rows.in().
  virtual std::unique_ptr<ForwardRows> dispatch_forward(const DispatchPlan& p, const Tensor& x) = 0;
  // The same where the send order is the expert side (local: ep = 1):
  // x's rows gathered straight into expert_in [R, d] (a bf16 expert_in is
  // rounded as the rows are copied: one pass), and rows whose in() is left
  // unfilled; nullptr from the transports whose rows travel f32.
  virtual std::unique_ptr<ForwardRows> dispatch_forward_into(const DispatchPlan&, const Tensor&,
                                                             const Tensor&) {
    return nullptr;
  }
  // After the experts wrote rows.out(): brings them back (rows.returned()).
  // Collective over ep.
  virtual void return_forward(const DispatchPlan& p, ForwardRows& rows) = 0;

 protected:
  explicit Transport(const kernels::Ctx& ctx) : ctx_(ctx) {}
  // A span of `kind` from t0 to now, and a counter, when there is a sink.
  double stamp() const { return sink_ ? now_s() : 0.0; }
  void span(const char* kind, double t0) const {
    if (sink_) sink_->span(prof::Span{kind, -1, -1, -1, t0, now_s()});
  }
  void count(const char* counter, double amount) const {
    if (sink_) sink_->add(counter, amount);
  }
  // The exchange posted: the other lane of an overlapped pair computes
  // (overlap::in_flight), then the exchange completes.
  static void finish(Exchange& x);

  kernels::Ctx ctx_;  // where the rows live and the kernels run
  std::string reason_;
  prof::Sink* sink_ = nullptr;
  SharedMemoryUse shared_;

 private:
  Tensor send_;  // permute's rows
};

// ep: nullptr or size 1 gives the local transport; otherwise `choice`
// (runtime.ep_transport), automatic being shm when every ep rank is on this
// node. shm across nodes is an InputError naming runtime.ep_transport.
std::unique_ptr<Transport> make_transport(Communicator* ep, EpTransportChoice choice,
                                          double shm_limit_bytes, const kernels::Ctx& ctx);

// The implementations (src/parallel/ep/transport/).
std::unique_ptr<Transport> make_local_transport(const kernels::Ctx& ctx);
std::unique_ptr<Transport> make_alltoallv_transport(Communicator& ep, const kernels::Ctx& ctx);
std::unique_ptr<Transport> make_shm_transport(Communicator& ep, double shm_limit_bytes,
                                              const kernels::Ctx& ctx);

}  // namespace trident::ep
