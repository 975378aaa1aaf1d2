// Communicator: one group of ranks (a cp ring, a pp group, an ep group, ...)
// with byte and time accounting per kind, and a deadline on every wait.
//
// MPI (Open MPI over UCX) implements it for host buffers; the CUDA issue adds
// NCCL behind the same calls for device buffers. Every blocking wait polls
// its request until runtime.timeout_s and then throws TimeoutError naming the
// rank, the operation and the peer, so a stuck job ends instead of hanging.
// Sizes are in bytes for point-to-point and in elements for collectives.
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trident {

// Accounting columns of /metrics/comm_bytes, in this order.
enum class CommKind : int { cp = 0, pp = 1, ep = 2, dp = 3, world = 4 };
constexpr int kNumCommKinds = 4;  // world traffic is not a column
const char* comm_kind_name(CommKind k);

// Cumulative counters of one process. Sent bytes, time inside communication
// calls, and time blocked in waits (the part not hidden behind compute).
// bytes_sent is what this rank hands to others: a send's payload (counted
// when its wait or test completes), allreduce: its own n elements, allgather:
// its block, alltoallv/alltoall: the blocks for the other ranks (not its own),
// broadcast: the bytes at the root only, barrier: 0. A wait that times out
// adds its time but no bytes. calls counts completed operations.
struct CommCounters {
  std::array<double, 5> bytes_sent{};
  std::array<double, 5> wait_s{};
  std::array<int64_t, 5> calls{};
  void add(CommKind k, double bytes, double wait) {
    bytes_sent[int(k)] += bytes;
    wait_s[int(k)] += wait;
    calls[int(k)] += 1;
  }
  CommCounters operator-(const CommCounters& o) const;
};

// Process-wide counters (one set per process; not per communicator, so that
// the step's totals are one read).
CommCounters& comm_counters();

// A pending non-blocking operation. Move-only; wait() before destruction.
// One destroyed while pending (an exception unwound past its wait) is
// released: a receive is cancelled so nothing writes into a freed buffer.
class Request {
 public:
  Request() = default;
  Request(Request&&) noexcept;
  Request& operator=(Request&&) noexcept;
  Request(const Request&) = delete;
  ~Request();
  bool active() const { return req_ != MPI_REQUEST_NULL; }

 private:
  friend class Communicator;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::string what_;  // "send to rank 3 (cp)" for the timeout message
  CommKind kind_ = CommKind::world;
  double bytes_ = 0;
  bool is_send_ = false;
};

class Communicator {
 public:
  // Wraps (does not duplicate) comm; takes ownership if owned is true.
  Communicator(MPI_Comm comm, CommKind kind, std::string name, double timeout_s, bool owned);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  CommKind kind() const { return kind_; }
  const std::string& name() const { return name_; }
  MPI_Comm mpi() const { return comm_; }
  double timeout_s() const { return timeout_s_; }
  int world_rank_of(int group_rank) const;  // world rank of a member

  // Point to point (bytes). Tags distinguish concurrent streams.
  Request isend(const void* buf, size_t bytes, int peer, int tag);
  Request irecv(void* buf, size_t bytes, int peer, int tag);
  // Waits with the deadline; the wait time goes to this kind's wait counter.
  void wait(Request& r);
  void wait_all(std::vector<Request>& rs);
  bool test(Request& r);  // true when complete (and then accounted)

  // Collectives on float/double/int64 (in place), each with the deadline.
  void allreduce_sum(float* data, size_t n);
  void allreduce_sum(double* data, size_t n);
  void allreduce_sum(int64_t* data, size_t n);
  void allreduce_max(double* data, size_t n);
  void allreduce_min(double* data, size_t n);
  void allreduce_max(int* data, size_t n);
  void broadcast(void* data, size_t bytes, int root);
  // Every rank contributes `bytes` bytes; out holds size()*bytes.
  void allgather(const void* in, void* out, size_t bytes);
  // all-to-all-v in units of `elem_bytes` (counts and displacements in elements).
  void alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                 const std::vector<int64_t>& send_displs, void* recv,
                 const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                 size_t elem_bytes);
  // all-to-all of one int64 per peer (e.g. per-expert counts).
  void alltoall(const int64_t* send, int64_t* recv, size_t per_peer);
  void barrier();

 private:
  void wait_mpi(MPI_Request& req, const std::string& what, CommKind kind, double bytes_sent);

  MPI_Comm comm_;
  CommKind kind_;
  std::string name_;
  double timeout_s_;
  bool owned_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
};

// Clock shared by all ranks, seconds: CLOCK_MONOTONIC, which the processes
// of one host share exactly, plus this host's offset from world rank 0's
// host, measured by sync_clock() (a collective over `world`; 0 on rank 0's
// host, and everywhere before the first call).
double now_s();
void sync_clock(MPI_Comm world);

}  // namespace trident
