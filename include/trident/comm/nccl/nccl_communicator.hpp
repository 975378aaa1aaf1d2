// NcclCommunicator: the Communicator over NCCL, for device buffers. Built
// only when CUDA and NCCL are found (TRIDENT_HAVE_NCCL); this header needs
// neither (handles are opaque), so the factory can name the class.
//
// - Bootstrap: made from a host communicator of the same ranks (an
//   MpiCommunicator in trident; its host group), over which rank 0's NCCL
//   unique id is broadcast; the NCCL
//   communicator is created non-blocking and its initialisation is polled
//   against the deadline like any wait.
// - Device: the CUDA device current when it is made (the caller selects the
//   rank's device first, e.g. the topology's RankInfo::device).
// - Streams: every operation runs on this communicator's own stream, after
//   an event recorded on the compute stream (set_compute_stream), so it
//   reads what compute wrote before it was posted; its completion is a CUDA
//   event. wait()/test() poll that event and ncclCommGetAsyncError against
//   the deadline; wait_on_compute() makes the compute stream wait for the
//   event without blocking the host (the request stays pending until a
//   wait or test, which keep the deadline).
// - On timeout the NCCL communicator is aborted (ncclCommAbort), so no
//   kernel stays stuck and the job ends with the watchdog's message. After
//   that, every request still pending and every new operation throws an
//   Error saying so; nothing touches the freed NCCL communicator.
// - Buffer lifetimes: every device buffer of an operation is recorded as in
//   use until the operation's event (kernels/buffer_uses.hpp); the CUDA
//   allocator's stream waits for that event before it frees the buffer, so
//   the memory is not handed to a new allocation while NCCL still uses it.
// - Point to point: ncclSend/ncclRecv; a send and a receive between the
//   same ranks go in one begin_group()/end_group(). NCCL has no tags: the messages
//   between two ranks match in posting order, so both sides must post them
//   in the same order (the ring and the pipeline executor do).
// - all-to-all-v: grouped send/recv of alltoallv_plan (p2p_plan.hpp), the
//   kept block a device copy. all-reduce, broadcast, all-gather: NCCL's.
// - Host buffers (scalars such as a loss or a count) and barriers go to the
//   host group over MPI, so the same call sites work with either backend.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/comm/op_buffers.hpp"

namespace trident {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over host (every rank of it constructs one).
  explicit NcclCommunicator(std::unique_ptr<Communicator> host);
  ~NcclCommunicator() override;

  const char* backend_name() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }
  int max_tag() const override;
  Communicator& host() override { return *host_; }
  std::unique_ptr<Communicator> split(int color, int key, CommKind kind, std::string name) override;
  std::unique_ptr<Communicator> split_node(CommKind kind, std::string name) override;
  void wait_on_compute(Request& r) override;
  void begin_group() override;
  void end_group() override;
  bool in_order_p2p() const override { return true; }

  // The communication stream (a cudaStream_t).
  void* stream() const { return stream_; }

 protected:
  // Host buffers go to the host group; device buffers to NCCL.
  std::unique_ptr<PendingOp> post(const CommOp& op) override;
  size_t max_elements_per_reduction() const override;
  void on_timeout() override;

 private:
  struct Handles;  // ncclComm_t, the events: CUDA types kept out of this header
  // Orders the communication stream after the compute stream's work so far.
  void follow_compute();
  // The completion of what was just enqueued on the communication stream.
  std::unique_ptr<PendingOp> completion();
  // Waits (with the deadline) until the last NCCL call has been issued.
  void settle(int result, const char* call);
  // Throws once the communicator has been aborted (after a timeout).
  void check_alive() const;

  // A send or receive posted inside a group: its completion is known at
  // end_group(), once the group has been enqueued.
  std::unique_ptr<PendingOp> in_group();
  // NCCL has no all-to-all-v: grouped sends and receives (p2p_plan.hpp).
  std::unique_ptr<PendingOp> post_alltoallv(const CommOp& op);
  // Records the buffers as in use until what was just enqueued on the
  // communication stream is done (kernels/buffer_uses.hpp).
  void record_uses(const std::vector<OpBuffer>& buffers);

  std::unique_ptr<Communicator> host_;
  std::unique_ptr<Handles> h_;
  void* stream_ = nullptr;
  int device_ = 0;
};

}  // namespace trident
