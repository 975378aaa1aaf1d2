// Communicator: one group of ranks (a cp ring, a pp group, an ep group, ...)
// with byte and time accounting per kind, and a deadline on every wait.
//
// The seam between the layers above and the transports. This class is the
// common part: argument checks, the accounting, the one watchdog loop and the
// timeout messages. A backend (comm/mpi: MpiCommunicator, host buffers;
// comm/nccl: NcclCommunicator, device buffers) only posts operations, each
// handed to it as one CommOp, and hands back a PendingOp that can be polled,
// so every wait of every backend
// polls until runtime.timeout_s and then throws TimeoutError naming the rank,
// the operation and the peer: a stuck job ends instead of hanging.
// runtime.comm picks the backend once (comm/backend.hpp).
//
// Streams and events: a device backend runs its operations on its own
// communication stream, ordered after the work queued so far on the compute
// stream (set_compute_stream) by an event; wait_on_compute(r) makes later
// compute-stream work wait for r without blocking the host; wait(r) blocks
// the host. On the host backend the compute stream is null, an operation's
// data is read when it is posted, overlap is progress polling (test()), and
// wait_on_compute is wait.
//
// Sizes are in bytes for point-to-point and in elements for collectives.
// Buffers live on device() (the host for MPI).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/clock.hpp"
#include "trident/core/device.hpp"
#include "trident/core/staging.hpp"

namespace trident {

// Accounting columns of /metrics/comm_bytes, in this order.
enum class CommKind : int { cp = 0, pp = 1, ep = 2, dp = 3, world = 4 };
constexpr int kNumCommKinds = 4;  // world traffic is not a column
const char* comm_kind_name(CommKind k);

// Cumulative counters of one set of communicators (Communicator::counters():
// a communicator and the groups split off it, so the mesh's groups of one
// job share the world's and a step's totals are one read). Sent bytes, time
// inside communication calls, and time blocked in waits (the part not
// hidden behind compute) and inside non-blocking tests (test(): on an
// oversubscribed node the MPI library may yield the core there, and that
// time is not the rank's compute: faults.md "Which rank is slow").
// bytes_sent is what this rank hands to others: a send's payload (counted
// when its wait or test completes), allreduce: its own n elements,
// reduce_scatter: its input (every rank's block), allgather: its block,
// alltoallv/alltoall: the blocks for the other ranks (not its own),
// broadcast: the bytes at the root only, barrier: 0. A wait that times out
// adds its time but no bytes. calls counts completed operations.
// longest_wait_s: the longest single wait (any kind, since the process
// started), the figure runtime.timeout_s must stay above (faults.md); a
// difference of counters keeps the left side's.
struct CommCounters {
  std::array<double, 5> bytes_sent{};
  std::array<double, 5> wait_s{};
  std::array<int64_t, 5> calls{};
  double longest_wait_s = 0;
  void add(CommKind k, double bytes, double wait) {
    bytes_sent[int(k)] += bytes;
    wait_s[int(k)] += wait;
    calls[int(k)] += 1;
    if (wait > longest_wait_s) longest_wait_s = wait;
  }
  CommCounters operator-(const CommCounters& o) const;
};

// A backend's posted operation: an MPI request, or a CUDA event recorded on
// the communication stream behind the NCCL calls. poll() never blocks and
// returns true once the operation is complete (its buffers may be reused).
// Destroyed while still pending (an exception unwound past its wait), it is
// released so that nothing writes into a freed buffer afterwards.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual bool poll() = 0;
};

// A pending non-blocking operation of a Communicator. Move-only; wait()
// before destruction (a pending one destroyed is released, see PendingOp).
class Request {
 public:
  Request() = default;
  bool active() const { return op_ != nullptr; }

 private:
  friend class Communicator;
  std::unique_ptr<PendingOp> op_;
  std::string what_;  // "send of 64 B to rank 3 (world 5, tag 2)" for the timeout message
  CommKind kind_ = CommKind::world;
  double bytes_ = 0;     // accounted as sent when complete
  uint64_t flight_ = 0;  // its flight record (comm/flight_recorder.hpp); 0: none
};

// Element types and reductions of the collectives.
enum class ElemType : uint8_t { f32, f64, i32, i64 };
enum class ReduceOp : uint8_t { sum, max, min };
// How a float sum over three or more ranks is bracketed (over two, a + b is
// the same either way round). any: as the backend's algorithm chooses, which
// can depend on the operation and the message's size, so an all-reduce and
// a reduce-scatter of the same data may differ in the last bits. rank: every
// element as ((x_0 + x_1) + x_2) + ... + x_{p-1}, in group-rank order,
// whatever the operation, its size or the element's position in it, so that
// all-reduces, reduce-scatters and reduces of pieces of the same data give
// the same bits (the MPI backend; NCCL keeps its own order, see
// share/trident/memory.md).
enum class SumOrder : uint8_t { any, rank };
size_t elem_size(ElemType t);
const char* elem_name(ElemType t);  // "float" | "double" | "int" | "int64_t"

// One operation as the common part hands it to a backend, arguments
// checked: a flat descriptor with a kind, as NCCL's ncclInfo and UCC's
// collective arguments are, so that a backend implements one post() that
// branches on the kind (a device backend sends every host-buffer operation
// to its host group in one place) and an operation is added without
// touching the backends' class declarations. Fields a kind does not name
// are unused.
struct CommOp {
  enum class Kind : uint8_t {
    send,
    recv,
    allreduce,
    broadcast,
    allgather,
    alltoallv,
    barrier,
    reduce_scatter,
    reduce
  };
  Kind kind = Kind::barrier;
  // send: the message; allgather: this rank's block; alltoallv: what is sent;
  // reduce_scatter: every rank's block, one after another.
  const void* in = nullptr;
  // recv: the message; allreduce, broadcast: the data (in place); allgather:
  // every rank's block; alltoallv: what is received; reduce_scatter: this
  // rank's block of the sum; reduce: the data (in place: the sum lands in
  // the root's, the others' is only read).
  void* out = nullptr;
  size_t bytes = 0;               // send, recv, broadcast; allgather: per rank
  size_t count = 0;               // allreduce, reduce: elements of `type`; reduce_scatter: per rank
  int peer = 0;                   // send, recv: the other rank; broadcast, reduce: the root
  int tag = 0;                    // send, recv
  ElemType type = ElemType::f32;  // allreduce, reduce_scatter
  ReduceOp reduce = ReduceOp::sum;  // allreduce, reduce_scatter
  SumOrder order = SumOrder::any;   // allreduce, reduce_scatter, reduce of f32 sums
  // alltoallv: per peer, in elements of elem_bytes bytes.
  const int64_t* send_counts = nullptr;
  const int64_t* send_displs = nullptr;
  const int64_t* recv_counts = nullptr;
  const int64_t* recv_displs = nullptr;
  size_t elem_bytes = 0;
};

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return int(world_ranks_.size()); }
  CommKind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  double timeout_s() const { return timeout_s_; }
  // The deadline of every later wait (comm_group gives a group its own).
  void set_timeout_s(double seconds) { timeout_s_ = seconds; }
  int world_rank_of(int group_rank) const;  // world rank of a member
  // The counters this communicator adds to, shared with every group split
  // off it (and the host group a device communicator is built on).
  CommCounters& counters() const { return *counters_; }

  // "mpi" | "nccl"; where the buffers of this communicator live.
  virtual const char* backend_name() const = 0;
  virtual Device device() const = 0;
  // Largest tag point-to-point accepts (at least 32767).
  virtual int max_tag() const = 0;
  // The host (MPI) communicator of the same ranks: itself for MPI; the group
  // a device communicator was bootstrapped on. Control traffic and libraries
  // that need MPI (parallel HDF5, shared windows) go through it.
  virtual Communicator& host() = 0;
  const Communicator& host() const { return const_cast<Communicator*>(this)->host(); }

  // Sub-groups, collective over this communicator: the ranks that pass the
  // same color (>= 0), ordered by key, on the same backend; color < 0: this
  // rank joins no group and gets nullptr. split_node: the ranks of this
  // group that share this rank's node (host communicator).
  virtual std::unique_ptr<Communicator> split(int color, int key, CommKind kind,
                                              std::string name) = 0;
  virtual std::unique_ptr<Communicator> split_node(CommKind kind, std::string name) = 0;

  // Streams and events (see the file comment). stream: a cudaStream_t, or
  // null for the host.
  void set_compute_stream(void* stream) { compute_stream_ = stream; }
  void* compute_stream() const { return compute_stream_; }
  virtual void wait_on_compute(Request& r) { wait(r); }

  // Buffers of `staging`'s device handed to a host backend (MPI) travel
  // through host memory by its explicit copies: the path of a GPU's tensors
  // under runtime.comm = "mpi", and of the emulated device's. Set once per
  // communicator by whoever owns the device (train::run); groups split off
  // later inherit it. A device backend (NCCL) moves its device's buffers
  // itself and ignores it. Null: every buffer is a host buffer.
  virtual void stage_device_buffers(std::shared_ptr<DeviceStaging> staging) { (void)staging; }

  // Point-to-point operations posted between begin_group() and end_group()
  // start together: a device backend needs that for a send and a receive
  // between the same two ranks (NCCL would deadlock on them one by one);
  // MPI starts each at once. Wait for a group's requests after end_group().
  virtual void begin_group() {}
  virtual void end_group() {}
  // Whether point-to-point operations run in posting order on one stream,
  // matched without tags (NCCL): a posted receive then holds every later
  // operation of this rank until its sender's matching send runs, so callers
  // post in an order both sides share and put in one group the sends and
  // receives that must run together. False: MPI's tag matching, where any
  // receive may be posted early.
  virtual bool in_order_p2p() const { return false; }

  // Point to point (bytes). Tags distinguish concurrent streams.
  Request isend(const void* buf, size_t bytes, int peer, int tag);
  Request irecv(void* buf, size_t bytes, int peer, int tag);
  // Waits with the deadline; the wait time goes to this kind's wait counter.
  void wait(Request& r);
  void wait_all(std::vector<Request>& rs);
  bool test(Request& r);  // true when complete (and then accounted)

  // Collectives (in place), each with the deadline. An empty reduction still
  // takes part, so every rank issues the same sequence of collectives.
  void allreduce_sum(float* data, size_t n, SumOrder order = SumOrder::any) {
    allreduce(data, n, ElemType::f32, ReduceOp::sum, order);
  }
  void allreduce_sum(double* data, size_t n) { allreduce(data, n, ElemType::f64, ReduceOp::sum); }
  void allreduce_sum(int64_t* data, size_t n) { allreduce(data, n, ElemType::i64, ReduceOp::sum); }
  void allreduce_max(double* data, size_t n) { allreduce(data, n, ElemType::f64, ReduceOp::max); }
  void allreduce_max(int* data, size_t n) { allreduce(data, n, ElemType::i32, ReduceOp::max); }
  void allreduce_max(int64_t* data, size_t n) { allreduce(data, n, ElemType::i64, ReduceOp::max); }
  void allreduce_min(double* data, size_t n) { allreduce(data, n, ElemType::f64, ReduceOp::min); }
  void allreduce_min(int* data, size_t n) { allreduce(data, n, ElemType::i32, ReduceOp::min); }
  void allreduce_min(int64_t* data, size_t n) { allreduce(data, n, ElemType::i64, ReduceOp::min); }
  void allreduce(void* data, size_t n, ElemType type, ReduceOp op, SumOrder order = SumOrder::any);
  void broadcast(void* data, size_t bytes, int root);
  // in holds size() blocks of `count` floats; out (not overlapping in)
  // receives the sum over ranks of block rank().
  void reduce_scatter_sum(const float* in, float* out, size_t count,
                          SumOrder order = SumOrder::any);
  // Non-blocking sums of n floats (n <= what one operation takes), posted
  // now and finished by wait() (with the deadline) or test(); the buffer is
  // the operation's until then. Every rank posts the same sequence, as for
  // the blocking collectives. iallreduce_sum: in place on every rank;
  // ireduce_sum: the sum lands in root's data, the others' is only read.
  Request iallreduce_sum(float* data, size_t n, SumOrder order = SumOrder::any);
  Request ireduce_sum(float* data, size_t n, int root, SumOrder order = SumOrder::any);
  // Every rank contributes `bytes` bytes; out holds size()*bytes.
  void allgather(const void* in, void* out, size_t bytes);
  // all-to-all-v in units of `elem_bytes` (counts and displacements in elements).
  void alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                 const std::vector<int64_t>& send_displs, void* recv,
                 const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                 size_t elem_bytes);
  // all-to-all of `per_peer` int64 per peer (e.g. per-expert counts).
  void alltoall(const int64_t* send, int64_t* recv, size_t per_peer);
  void barrier();

 protected:
  // rank: this process's position; world_ranks: the world rank of each member.
  Communicator(CommKind kind, std::string name, double timeout_s, int rank,
               std::vector<int> world_ranks);

  // The backend: post an operation (never block) and return its handle.
  virtual std::unique_ptr<PendingOp> post(const CommOp& op) = 0;
  // Most elements one posted allreduce takes; larger reductions go in pieces.
  virtual size_t max_elements_per_reduction() const = 0;
  // Runs once when a wait passes its deadline, before TimeoutError is
  // thrown: a device backend aborts its communicator so nothing stays stuck.
  virtual void on_timeout() {}

  // A backend that hands some operations to another communicator (a
  // device backend: those on host buffers, to its host group).
  static std::unique_ptr<PendingOp> post_to(Communicator& other, const CommOp& op) {
    return other.post(op);
  }
  // A group made from `parent` (a split, a device group over its host
  // group) adds to the parent's counters.
  void share_counters(const Communicator& parent) { counters_ = parent.counters_; }
  // For a backend's wait_on_compute: the operation behind a request.
  static PendingOp* pending_op(Request& r) { return r.op_.get(); }
  // Polls op until complete or the deadline; accounts bytes and the wait.
  // flight: the operation's flight record (0: none).
  void await(PendingOp& op, const std::string& what, CommKind kind, double bytes_sent,
             uint64_t flight = 0);

 private:
  Request post_sum(CommOp op, const std::string& what);
  // post(op), with the operation in the flight recorder; *flight: its record.
  std::unique_ptr<PendingOp> post_recorded(const CommOp& op, uint64_t* flight);

  CommKind kind_;
  std::string name_;
  double timeout_s_;
  int rank_;
  std::vector<int> world_ranks_;
  void* compute_stream_ = nullptr;
  std::shared_ptr<CommCounters> counters_ = std::make_shared<CommCounters>();
  // Flight recorder: this group's index, and its operations so far
  // (collectives, point-to-point), the records' sequence numbers.
  int flight_group_ = -1;
  uint64_t flight_seq_[2] = {0, 0};
};

// root's string on every rank of comm (collective).
std::string broadcast_string(Communicator& comm, const std::string& s, int root);

// Every rank's bytes, of any length, on root in rank order; the other ranks
// get an empty vector (collective: an allgather of the lengths, then a
// point-to-point message on `tag` from each rank with bytes to send). Every
// wait has comm's deadline.
std::vector<std::vector<char>> gather_bytes_to_root(Communicator& comm, std::vector<char> mine,
                                                    int root, int tag);

// A check every rank of comm made: whether all passed and, if not, the
// lowest failing rank and its message, the same on every rank (collective),
// so that all ranks can fail together with the reason of the rank that knows
// it instead of some ranks waiting for the others until their deadline.
struct CheckOutcome {
  bool all_passed = true;
  int rank = -1;
  std::string message;
};
CheckOutcome agree_on_check(Communicator& comm, bool passed, const std::string& message);

// Measures this host's clock offset to world rank 0's host and sets it in
// core's clock (set_host_clock_offset); collective over `world`. Ranks that
// share a host share the clock, so on one host nothing is measured.
void sync_clock(Communicator& world);

}  // namespace trident
