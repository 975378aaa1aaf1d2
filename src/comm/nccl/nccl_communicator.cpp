// NcclCommunicator: NCCL calls on a communication stream, each completion a
// CUDA event that the common watchdog polls together with NCCL's
// asynchronous error; host buffers and barriers go to the MPI host group.
#include "trident/comm/nccl/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "trident/comm/op_buffers.hpp"
#include "trident/comm/p2p_plan.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/buffer_uses.hpp"
#include "trident/kernels/cuda_check.hpp"

namespace trident {

namespace {

ncclDataType_t nccl_type(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return ncclFloat32;
    case ElemType::f64:
      return ncclFloat64;
    case ElemType::i32:
      return ncclInt32;
    case ElemType::i64:
      return ncclInt64;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

// Whether ptr is device (or managed) memory; host pointers go over MPI.
bool on_device(const void* ptr) {
  if (ptr == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    cudaGetLastError();  // an unregistered host pointer: clear the sticky-free error
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// Whether op goes to NCCL: its buffers are on the device (an all-to-all-v
// when either side is).
bool on_device(const CommOp& op) {
  switch (op.kind) {
    case CommOp::Kind::send:
      return on_device(op.in);
    case CommOp::Kind::alltoallv:
      return on_device(op.out) || on_device(op.in);
    default:
      return on_device(op.out);
  }
}

// The one NCCL call of a send, receive or collective, enqueued on stream s;
// returns NCCL's result and the call's name.
std::pair<int, const char*> enqueue(const CommOp& op, ncclComm_t comm, cudaStream_t s) {
  switch (op.kind) {
    case CommOp::Kind::send:
      return {ncclSend(op.in, op.bytes, ncclUint8, op.peer, comm, s), "ncclSend"};
    case CommOp::Kind::recv:
      return {ncclRecv(op.out, op.bytes, ncclUint8, op.peer, comm, s), "ncclRecv"};
    case CommOp::Kind::allreduce:
      return {
          ncclAllReduce(op.out, op.out, op.count, nccl_type(op.type), nccl_op(op.reduce), comm, s),
          "ncclAllReduce"};
    case CommOp::Kind::broadcast:
      return {ncclBroadcast(op.out, op.out, op.bytes, ncclUint8, op.peer, comm, s),
              "ncclBroadcast"};
    case CommOp::Kind::allgather:
      return {ncclAllGather(op.in, op.out, op.bytes, ncclUint8, comm, s), "ncclAllGather"};
    case CommOp::Kind::reduce_scatter:
      return {ncclReduceScatter(op.in, op.out, op.count, nccl_type(op.type), nccl_op(op.reduce),
                                comm, s),
              "ncclReduceScatter"};
    case CommOp::Kind::reduce:
      return {ncclReduce(op.out, op.out, op.count, nccl_type(op.type), nccl_op(op.reduce), op.peer,
                         comm, s),
              "ncclReduce"};
    default:
      throw Error("NCCL: no single call posts operation kind " + std::to_string(int(op.kind)));
  }
}

// The NCCL communicator as its pending operations see it: shared with them,
// and emptied when the communicator is aborted, so that a request still
// pending after a timeout (or polled during unwinding) never passes a freed
// ncclComm_t to NCCL.
struct LiveComm {
  ncclComm_t comm = nullptr;
  std::string name;
  bool aborted() const { return comm == nullptr; }
};

std::string aborted_message(const LiveComm& live) {
  return "NCCL: communicator " + live.name +
         " was aborted after a wait timed out (or destroyed); its pending operations are void";
}

// The completion of the operations enqueued before the event, plus NCCL's
// asynchronous error (a failed peer turns into an Error, not a hang).
class CudaEventOp final : public PendingOp {
 public:
  CudaEventOp(cudaEvent_t ev, std::shared_ptr<const LiveComm> live)
      : ev_(ev), live_(std::move(live)) {}
  ~CudaEventOp() override { cudaEventDestroy(ev_); }  // released once complete
  bool poll() override {
    if (live_->aborted()) throw Error(aborted_message(*live_));
    const cudaError_t q = cudaEventQuery(ev_);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) kernels::cuda::throw_cuda(__FILE__, __LINE__, "cudaEventQuery", q);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(live_->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress)
      throw Error(std::string("NCCL: ") + ncclGetErrorString(async));
    return false;
  }

 private:
  cudaEvent_t ev_;
  std::shared_ptr<const LiveComm> live_;
};

// The end of a device operation's use of its buffers: an event recorded on
// the communication stream after it (kernels/buffer_uses.hpp). An allocator
// makes its stream wait for it before a free, so the stream-ordered pool
// cannot give the memory to a new allocation while NCCL still reads or
// writes it, even when the operation's request was released unwaited.
class CudaEventFence final : public kernels::UseFence {
 public:
  explicit CudaEventFence(cudaStream_t s) {
    CUDA_CHECK(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(ev_, s));
  }
  ~CudaEventFence() override { cudaEventDestroy(ev_); }
  bool done() override {
    const cudaError_t q = cudaEventQuery(ev_);
    if (q == cudaErrorNotReady) return false;
    if (q != cudaSuccess) (void)cudaGetLastError();  // a broken context frees nothing later
    return true;
  }
  void order_before(void* stream, double timeout_s) override {
    if (stream) {
      CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev_, 0));
      return;
    }
    kernels::wait_for_fence(*this, timeout_s, "a free after an NCCL operation");
  }

 private:
  cudaEvent_t ev_ = nullptr;
};

// One operation after another: `next` is posted once `first` completes.
class Sequence final : public PendingOp {
 public:
  Sequence(std::unique_ptr<PendingOp> first, std::function<std::unique_ptr<PendingOp>()> next)
      : first_(std::move(first)), next_(std::move(next)) {}
  bool poll() override {
    if (first_) {
      if (!first_->poll()) return false;
      first_.reset();
      second_ = next_();
    }
    return second_->poll();
  }

 private:
  std::unique_ptr<PendingOp> first_, second_;
  std::function<std::unique_ptr<PendingOp>()> next_;
};

// A group member's completion, shared by the group's operations and set
// when the group is enqueued.
class GroupMemberOp final : public PendingOp {
 public:
  explicit GroupMemberOp(std::shared_ptr<std::shared_ptr<PendingOp>> done)
      : done_(std::move(done)) {}
  bool poll() override {
    TRIDENT_CHECK(*done_ != nullptr,
                  "NCCL: a request of an open group was waited (end_group first)");
    return (*done_)->poll();
  }

 private:
  std::shared_ptr<std::shared_ptr<PendingOp>> done_;
};

// Complete from the start (an empty operation).
class DoneOp final : public PendingOp {
 public:
  bool poll() override { return true; }
};

}  // namespace

struct NcclCommunicator::Handles {
  // live->comm: the NCCL communicator, null before initialisation and after
  // an abort (aborted: set once ncclCommAbort has run).
  std::shared_ptr<LiveComm> live = std::make_shared<LiveComm>();
  bool aborted = false;
  cudaEvent_t compute_done = nullptr;  // reused: recorded on compute, waited on by comm
  // The open group's completion slot (null outside a group).
  std::shared_ptr<std::shared_ptr<PendingOp>> group;
  // Whether the open group's first device operation has ordered the
  // communication stream after the compute stream.
  bool group_follows_compute = false;
  // The open group's device buffers, recorded as in use at end_group().
  std::vector<OpBuffer> group_buffers;
};

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> host)
    : Communicator(host->kind(), host->name(), host->timeout_s(), host->rank(),
                   [&] {
                     std::vector<int> w(size_t(host->size()));
                     for (int i = 0; i < host->size(); ++i) w[size_t(i)] = host->world_rank_of(i);
                     return w;
                   }()),
      host_(std::move(host)),
      h_(std::make_unique<Handles>()) {
  h_->live->name = name();
  share_counters(*host_);
  CUDA_CHECK(cudaGetDevice(&device_));
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  CUDA_CHECK(cudaEventCreateWithFlags(&h_->compute_done, cudaEventDisableTiming));
  ncclUniqueId id{};
  if (rank() == 0) settle(ncclGetUniqueId(&id), "ncclGetUniqueId");
  host_->broadcast(&id, sizeof id, 0);
  // Non-blocking initialisation: a rank that never joins is a timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t rc = ncclCommInitRankConfig(&h_->live->comm, size(), id, rank(), &config);
  settle(rc, "ncclCommInitRankConfig");
}

NcclCommunicator::~NcclCommunicator() {
  // After an abort (on_timeout) the communicator is gone already.
  if (ncclComm_t comm = h_->live->comm) {
    ncclCommFinalize(comm);
    ncclResult_t state = ncclInProgress;
    const double t0 = monotonic_s();
    while (state == ncclInProgress && monotonic_s() - t0 < timeout_s())
      ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess)
      ncclCommDestroy(comm);
    else
      ncclCommAbort(comm);
    h_->live->comm = nullptr;
  }
  if (h_->compute_done) cudaEventDestroy(h_->compute_done);
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void NcclCommunicator::check_alive() const {
  if (h_->aborted) throw Error(aborted_message(*h_->live));
}

void NcclCommunicator::settle(int result, const char* call) {
  check_alive();
  auto rc = ncclResult_t(result);
  const double t0 = monotonic_s();
  // Before initialisation there is no communicator to ask (ncclGetUniqueId).
  while (rc == ncclInProgress && h_->live->comm) {
    if (monotonic_s() - t0 > timeout_s()) {
      on_timeout();
      throw TimeoutError("rank " + std::to_string(world_rank_of(rank())) + ": " + call + " on " +
                         name() + " (" + comm_kind_name(kind()) + ") timed out");
    }
    ncclCommGetAsyncError(h_->live->comm, &rc);
  }
  if (rc != ncclSuccess && rc != ncclInProgress)
    throw Error(std::string(call) + " on " + name() + " failed: " + ncclGetErrorString(rc));
}

int NcclCommunicator::max_tag() const { return INT_MAX; }

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, CommKind kind,
                                                      std::string name) {
  auto group = host_->split(color, key, kind, std::move(name));
  if (!group) return nullptr;
  return std::make_unique<NcclCommunicator>(std::move(group));
}

std::unique_ptr<Communicator> NcclCommunicator::split_node(CommKind kind, std::string name) {
  return host_->split_node(kind, std::move(name));
}

void NcclCommunicator::wait_on_compute(Request& r) {
  auto* op = dynamic_cast<CudaEventOp*>(pending_op(r));
  if (!op) {  // a host operation (or none): the host waits
    wait(r);
    return;
  }
  // The op's event was recorded on stream_; the compute stream waits for
  // everything up to it, which includes the op.
  cudaEvent_t ev = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(stream_)));
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(compute_stream()), ev, 0));
  cudaEventDestroy(ev);
}

void NcclCommunicator::begin_group() {
  check_alive();
  TRIDENT_CHECK(!h_->group, "NCCL: begin_group inside an open group on " + name());
  settle(ncclGroupStart(), "ncclGroupStart");
  h_->group_follows_compute = false;
  h_->group = std::make_shared<std::shared_ptr<PendingOp>>();
}

void NcclCommunicator::end_group() {
  TRIDENT_CHECK(h_->group != nullptr, "NCCL: end_group without begin_group on " + name());
  auto slot = std::move(h_->group);
  h_->group.reset();
  settle(ncclGroupEnd(), "ncclGroupEnd");
  *slot = completion();
  record_uses(h_->group_buffers);
  h_->group_buffers.clear();
}

void NcclCommunicator::record_uses(const std::vector<OpBuffer>& buffers) {
  if (buffers.empty()) return;
  auto fence = std::make_shared<CudaEventFence>(static_cast<cudaStream_t>(stream_));
  for (const OpBuffer& b : buffers) kernels::buffer_uses().record(b.ptr, b.bytes, fence);
}

std::unique_ptr<PendingOp> NcclCommunicator::in_group() {
  return std::make_unique<GroupMemberOp>(h_->group);
}

void NcclCommunicator::follow_compute() {
  // Without it a buffer that compute frees (cudaFreeAsync) and reuses could
  // still be read or written by NCCL: refused rather than unordered.
  TRIDENT_CHECK(compute_stream() != nullptr,
                "NCCL: communicator " + name() +
                    " has no compute stream (set_compute_stream): device operations would not "
                    "be ordered after compute");
  CUDA_CHECK(cudaEventRecord(h_->compute_done, static_cast<cudaStream_t>(compute_stream())));
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), h_->compute_done, 0));
}

std::unique_ptr<PendingOp> NcclCommunicator::completion() {
  cudaEvent_t ev = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(stream_)));
  return std::make_unique<CudaEventOp>(ev, h_->live);
}

size_t NcclCommunicator::max_elements_per_reduction() const { return SIZE_MAX; }

std::unique_ptr<PendingOp> NcclCommunicator::post(const CommOp& op) {
  using Kind = CommOp::Kind;
  if (op.kind == Kind::barrier) {
    // A barrier orders hosts; the device work posted before it completes
    // first (polled with the deadline), so nothing is in flight behind it.
    Communicator& h = *host_;
    return std::make_unique<Sequence>(completion(),
                                      [&h] { return post_to(h, {.kind = Kind::barrier}); });
  }
  const bool p2p = op.kind == Kind::send || op.kind == Kind::recv;
  if (p2p && op.bytes == 0) return std::make_unique<DoneOp>();
  if (!on_device(op)) return post_to(*host_, op);
  check_alive();
  if (op.kind == Kind::alltoallv) return post_alltoallv(op);
  // A send or receive inside a group follows the compute stream once, at
  // the group's first device operation (a group of host buffers needs none).
  const bool grouped = p2p && h_->group;
  if (!grouped || !h_->group_follows_compute) follow_compute();
  if (grouped) h_->group_follows_compute = true;
  const auto [rc, call] = enqueue(op, h_->live->comm, static_cast<cudaStream_t>(stream_));
  settle(rc, call);
  const std::vector<OpBuffer> buffers = op_buffers(op, size());
  if (grouped) {
    h_->group_buffers.insert(h_->group_buffers.end(), buffers.begin(), buffers.end());
    return in_group();
  }
  auto done = completion();
  record_uses(buffers);
  return done;
}

std::unique_ptr<PendingOp> NcclCommunicator::post_alltoallv(const CommOp& op) {
  const AlltoallvPlan plan = alltoallv_plan(rank(), size(), op.send_counts, op.send_displs,
                                            op.recv_counts, op.recv_displs, op.elem_bytes);
  auto s = static_cast<cudaStream_t>(stream_);
  const auto* src = static_cast<const char*>(op.in);
  auto* dst = static_cast<char*>(op.out);
  follow_compute();
  if (plan.self_copy)
    CUDA_CHECK(cudaMemcpyAsync(dst + plan.self_recv_offset, src + plan.self_send_offset,
                               plan.self_bytes, cudaMemcpyDeviceToDevice, s));
  settle(ncclGroupStart(), "ncclGroupStart");
  for (const P2pTransfer& t : plan.sends)
    settle(ncclSend(src + t.offset, t.bytes, ncclUint8, t.peer, h_->live->comm, s), "ncclSend");
  for (const P2pTransfer& t : plan.recvs)
    settle(ncclRecv(dst + t.offset, t.bytes, ncclUint8, t.peer, h_->live->comm, s), "ncclRecv");
  settle(ncclGroupEnd(), "ncclGroupEnd");
  auto done = completion();
  record_uses(op_buffers(op, size()));
  return done;
}

void NcclCommunicator::on_timeout() {
  if (ncclComm_t comm = h_->live->comm; comm && !h_->aborted) {
    // Emptied first: whatever polls during the abort or after it sees a
    // void communicator, never the freed handle.
    h_->live->comm = nullptr;
    h_->aborted = true;
    ncclCommAbort(comm);
  }
}

}  // namespace trident
