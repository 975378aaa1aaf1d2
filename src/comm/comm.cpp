// Communicator over MPI: non-blocking point-to-point and collectives, each
// waited by polling against a deadline so that a lost peer turns into a
// TimeoutError that names the rank, the operation and the peer instead of a
// hang; bytes and blocked time are accounted per communicator kind.
#include "trident/comm/comm.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <ctime>
#include <string>
#include <thread>

#include "mpi_check.hpp"
#include "trident/core/error.hpp"

namespace trident {

namespace {

int world_rank_now() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

std::string format_seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%gs", s);
  return b;
}

// Largest element count handed to one typed MPI call; larger buffers go in
// pieces (allreduce) or through a derived datatype (byte-sized operations).
constexpr size_t kMaxCount = size_t(INT_MAX);

// A datatype of exactly `bytes` bytes (count 1), so that sizes beyond INT_MAX
// need no int count: q blocks of 1 GiB followed by the remainder. The extent
// equals `bytes`, which allgather relies on to place each rank's block.
class ByteSpan {
 public:
  explicit ByteSpan(size_t bytes) {
    if (bytes <= kMaxCount) {
      type_ = MPI_BYTE;
      count_ = int(bytes);
      return;
    }
    constexpr size_t kBlock = size_t(1) << 30;
    MPI_Datatype block;
    MPI_CHECK(MPI_Type_contiguous(int(kBlock), MPI_BYTE, &block));
    const size_t q = bytes / kBlock, r = bytes % kBlock;
    int lens[2] = {int(q), int(r)};
    MPI_Aint displs[2] = {0, MPI_Aint(q * kBlock)};
    MPI_Datatype types[2] = {block, MPI_BYTE};
    MPI_CHECK(MPI_Type_create_struct(r ? 2 : 1, lens, displs, types, &type_));
    MPI_CHECK(MPI_Type_commit(&type_));
    MPI_Type_free(&block);
    owned_ = true;
    count_ = 1;
  }
  ~ByteSpan() {
    // Freeing a datatype after the operation was posted is allowed: MPI keeps
    // it alive until the operation completes.
    if (owned_) MPI_Type_free(&type_);
  }
  ByteSpan(const ByteSpan&) = delete;
  ByteSpan& operator=(const ByteSpan&) = delete;
  MPI_Datatype type() const { return type_; }
  int count() const { return count_; }

 private:
  MPI_Datatype type_ = MPI_BYTE;
  int count_ = 0;
  bool owned_ = false;
};

// Poll with a little spinning first (latency of small messages), then yield
// so that oversubscribed ranks sharing a core can make progress.
class Backoff {
 public:
  void pause() {
    ++n_;
    if (n_ < 64) return;
    if (n_ < 2048) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

 private:
  int n_ = 0;
};

double g_clock_offset = 0.0;  // process-wide, set once by sync_clock()

}  // namespace

const char* comm_kind_name(CommKind k) {
  switch (k) {
    case CommKind::cp:
      return "cp";
    case CommKind::pp:
      return "pp";
    case CommKind::ep:
      return "ep";
    case CommKind::dp:
      return "dp";
    case CommKind::world:
      return "world";
  }
  return "?";
}

CommCounters CommCounters::operator-(const CommCounters& o) const {
  CommCounters d;
  for (size_t i = 0; i < bytes_sent.size(); ++i) {
    d.bytes_sent[i] = bytes_sent[i] - o.bytes_sent[i];
    d.wait_s[i] = wait_s[i] - o.wait_s[i];
    d.calls[i] = calls[i] - o.calls[i];
  }
  return d;
}

CommCounters& comm_counters() {
  static CommCounters counters;
  return counters;
}

// ---- Request ----

Request::Request(Request&& o) noexcept
    : req_(o.req_),
      what_(std::move(o.what_)),
      kind_(o.kind_),
      bytes_(o.bytes_),
      is_send_(o.is_send_) {
  o.req_ = MPI_REQUEST_NULL;
}

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    Request previous(std::move(*this));  // released (if still pending) at scope end
    req_ = o.req_;
    what_ = std::move(o.what_);
    kind_ = o.kind_;
    bytes_ = o.bytes_;
    is_send_ = o.is_send_;
    o.req_ = MPI_REQUEST_NULL;
  }
  return *this;
}

Request::~Request() {
  // Reached only when a wait was skipped (an exception unwound past it): a
  // receive is cancelled so that no buffer is written after it is gone; a
  // send is released and completes on its own.
  if (req_ == MPI_REQUEST_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (!is_send_) MPI_Cancel(&req_);
  MPI_Request_free(&req_);
  req_ = MPI_REQUEST_NULL;
}

// ---- Communicator ----

Communicator::Communicator(MPI_Comm comm, CommKind kind, std::string name, double timeout_s,
                           bool owned)
    : comm_(comm), kind_(kind), name_(std::move(name)), timeout_s_(timeout_s), owned_(owned) {
  TRIDENT_CHECK(comm != MPI_COMM_NULL, "Communicator '" + name_ + "' built on MPI_COMM_NULL");
  TRIDENT_CHECK(timeout_s > 0, "Communicator '" + name_ + "': timeout_s must be > 0");
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
  MPI_Group mine, world;
  MPI_CHECK(MPI_Comm_group(comm_, &mine));
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> local(size_);
  for (int i = 0; i < size_; ++i) local[i] = i;
  world_ranks_.resize(size_);
  MPI_CHECK(MPI_Group_translate_ranks(mine, size_, local.data(), world, world_ranks_.data()));
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
}

Communicator::~Communicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

int Communicator::world_rank_of(int group_rank) const {
  TRIDENT_CHECK(group_rank >= 0 && group_rank < size_,
                "rank " + std::to_string(group_rank) + " is not in " + name_);
  return world_ranks_[group_rank];
}

void Communicator::wait_mpi(MPI_Request& req, const std::string& what, CommKind kind,
                            double bytes_sent) {
  const double t0 = MPI_Wtime();
  Backoff backoff;
  int done = 0;
  while (true) {
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) break;
    const double waited = MPI_Wtime() - t0;
    if (waited > timeout_s_) {
      comm_counters().wait_s[int(kind)] += waited;  // time lost, but no completed call
      throw TimeoutError("rank " + std::to_string(world_rank_now()) + ": " + what + " on " + name_ +
                         " (" + comm_kind_name(kind) + ") timed out after " +
                         format_seconds(timeout_s_));
    }
    backoff.pause();
  }
  comm_counters().add(kind, bytes_sent, MPI_Wtime() - t0);
}

// ---- point to point ----

Request Communicator::isend(const void* buf, size_t bytes, int peer, int tag) {
  TRIDENT_CHECK(peer >= 0 && peer < size_, "isend to rank " + std::to_string(peer) + " outside " +
                                               name_ + " of size " + std::to_string(size_));
  Request r;
  ByteSpan span(bytes);
  MPI_CHECK(MPI_Isend(buf, span.count(), span.type(), peer, tag, comm_, &r.req_));
  r.what_ = "send of " + std::to_string(bytes) + " B to rank " + std::to_string(peer) + " (world " +
            std::to_string(world_ranks_[peer]) + ", tag " + std::to_string(tag) + ")";
  r.kind_ = kind_;
  r.bytes_ = double(bytes);
  r.is_send_ = true;
  return r;
}

Request Communicator::irecv(void* buf, size_t bytes, int peer, int tag) {
  TRIDENT_CHECK(peer >= 0 && peer < size_, "irecv from rank " + std::to_string(peer) + " outside " +
                                               name_ + " of size " + std::to_string(size_));
  Request r;
  ByteSpan span(bytes);
  MPI_CHECK(MPI_Irecv(buf, span.count(), span.type(), peer, tag, comm_, &r.req_));
  r.what_ = "recv of " + std::to_string(bytes) + " B from rank " + std::to_string(peer) +
            " (world " + std::to_string(world_ranks_[peer]) + ", tag " + std::to_string(tag) + ")";
  r.kind_ = kind_;
  r.bytes_ = 0;
  r.is_send_ = false;
  return r;
}

void Communicator::wait(Request& r) {
  if (!r.active()) return;
  wait_mpi(r.req_, r.what_, r.kind_, r.bytes_);
  r.req_ = MPI_REQUEST_NULL;
}

void Communicator::wait_all(std::vector<Request>& rs) {
  // One deadline per request keeps the message precise about which peer is
  // missing; a slow peer does not consume the others' budget because the
  // earlier requests are usually complete by the time the later are polled.
  for (auto& r : rs) wait(r);
}

bool Communicator::test(Request& r) {
  if (!r.active()) return true;
  int done = 0;
  MPI_CHECK(MPI_Test(&r.req_, &done, MPI_STATUS_IGNORE));
  if (done) {
    comm_counters().add(r.kind_, r.bytes_, 0.0);
    r.req_ = MPI_REQUEST_NULL;
  }
  return done != 0;
}

// ---- collectives ----

namespace {
template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}
template <>
MPI_Datatype mpi_type<int64_t>() {
  return MPI_INT64_T;
}
template <>
MPI_Datatype mpi_type<int>() {
  return MPI_INT;
}

std::string elems(size_t n, const char* type) { return std::to_string(n) + " " + type; }
}  // namespace

// Pieces of at most INT_MAX elements; an empty reduction still takes part
// once so that every rank issues the same sequence of collectives.
#define TRIDENT_ALLREDUCE(T, OPNAME, MPIOP)                                                       \
  void Communicator::allreduce_##OPNAME(T* data, size_t n) {                                      \
    size_t off = 0;                                                                               \
    do {                                                                                          \
      const size_t len = std::min(kMaxCount, n - off);                                            \
      MPI_Request req;                                                                            \
      MPI_CHECK(                                                                                  \
          MPI_Iallreduce(MPI_IN_PLACE, data + off, int(len), mpi_type<T>(), MPIOP, comm_, &req)); \
      wait_mpi(req,                                                                               \
               "allreduce_" #OPNAME " of " + elems(len, #T) + " over " + std::to_string(size_) +  \
                   " ranks",                                                                      \
               kind_, double(len * sizeof(T)));                                                   \
      off += len;                                                                                 \
    } while (off < n);                                                                            \
  }

TRIDENT_ALLREDUCE(float, sum, MPI_SUM)
TRIDENT_ALLREDUCE(double, sum, MPI_SUM)
TRIDENT_ALLREDUCE(int64_t, sum, MPI_SUM)
TRIDENT_ALLREDUCE(double, max, MPI_MAX)
TRIDENT_ALLREDUCE(double, min, MPI_MIN)
TRIDENT_ALLREDUCE(int, max, MPI_MAX)
#undef TRIDENT_ALLREDUCE

void Communicator::broadcast(void* data, size_t bytes, int root) {
  TRIDENT_CHECK(root >= 0 && root < size_,
                "broadcast root " + std::to_string(root) + " outside " + name_);
  ByteSpan span(bytes);
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(data, span.count(), span.type(), root, comm_, &req));
  wait_mpi(req,
           "broadcast of " + std::to_string(bytes) + " B from rank " + std::to_string(root) +
               " (world " + std::to_string(world_ranks_[root]) + ")",
           kind_, rank_ == root ? double(bytes) : 0.0);
}

void Communicator::allgather(const void* in, void* out, size_t bytes) {
  ByteSpan span(bytes);
  MPI_Request req;
  MPI_CHECK(
      MPI_Iallgather(in, span.count(), span.type(), out, span.count(), span.type(), comm_, &req));
  wait_mpi(req,
           "allgather of " + std::to_string(bytes) + " B per rank over " + std::to_string(size_) +
               " ranks",
           kind_, double(bytes));
}

void Communicator::alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                             const std::vector<int64_t>& send_displs, void* recv,
                             const std::vector<int64_t>& recv_counts,
                             const std::vector<int64_t>& recv_displs, size_t elem_bytes) {
  const size_t p = size_t(size_);
  TRIDENT_CHECK(send_counts.size() == p && send_displs.size() == p && recv_counts.size() == p &&
                    recv_displs.size() == p,
                "alltoallv on " + name_ + ": counts and displacements need " + std::to_string(p) +
                    " entries");
  TRIDENT_CHECK(elem_bytes > 0 && elem_bytes <= kMaxCount,
                "alltoallv on " + name_ + ": bad element size " + std::to_string(elem_bytes));
  // Counts are in elements of a contiguous type of elem_bytes, so the int
  // limit applies to elements (2^31 per peer), not to bytes.
  auto to_int = [&](const std::vector<int64_t>& v, const char* what) {
    std::vector<int> out(p);
    for (size_t i = 0; i < p; ++i) {
      TRIDENT_CHECK(v[i] >= 0 && v[i] <= int64_t(INT_MAX),
                    "alltoallv on " + name_ + ": " + what + "[" + std::to_string(i) +
                        "] = " + std::to_string(v[i]) + " elements is outside [0, INT_MAX]");
      out[i] = int(v[i]);
    }
    return out;
  };
  const auto sc = to_int(send_counts, "send_counts"), sd = to_int(send_displs, "send_displs");
  const auto rc = to_int(recv_counts, "recv_counts"), rd = to_int(recv_displs, "recv_displs");
  MPI_Datatype elem;
  MPI_CHECK(MPI_Type_contiguous(int(elem_bytes), MPI_BYTE, &elem));
  MPI_CHECK(MPI_Type_commit(&elem));
  MPI_Request req;
  MPI_CHECK(MPI_Ialltoallv(send, sc.data(), sd.data(), elem, recv, rc.data(), rd.data(), elem,
                           comm_, &req));
  MPI_Type_free(&elem);
  int64_t out_elems = 0, in_elems = 0;
  for (size_t i = 0; i < p; ++i) {
    if (int(i) == rank_) continue;  // the part kept locally crosses no link
    out_elems += send_counts[i];
    in_elems += recv_counts[i];
  }
  wait_mpi(req,
           "alltoallv (sending " + std::to_string(out_elems) + ", receiving " +
               std::to_string(in_elems) + " elements of " + std::to_string(elem_bytes) +
               " B) over " + std::to_string(size_) + " ranks",
           kind_, double(out_elems) * double(elem_bytes));
}

void Communicator::alltoall(const int64_t* send, int64_t* recv, size_t per_peer) {
  TRIDENT_CHECK(per_peer <= kMaxCount, "alltoall on " + name_ + ": too many elements per peer");
  MPI_Request req;
  MPI_CHECK(MPI_Ialltoall(send, int(per_peer), MPI_INT64_T, recv, int(per_peer), MPI_INT64_T, comm_,
                          &req));
  wait_mpi(req,
           "alltoall of " + std::to_string(per_peer) + " int64 per peer over " +
               std::to_string(size_) + " ranks",
           kind_, double(per_peer * sizeof(int64_t) * (size_t(size_) - 1)));
}

void Communicator::barrier() {
  MPI_Request req;
  MPI_CHECK(MPI_Ibarrier(comm_, &req));
  wait_mpi(req, "barrier over " + std::to_string(size_) + " ranks", kind_, 0.0);
}

// ---- clock ----

namespace {

// CLOCK_MONOTONIC is one clock for every process of a host. MPI_Wtime is not:
// Open MPI counts it from an origin each process takes at start-up.
double monotonic_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

}  // namespace

double now_s() { return monotonic_s() + g_clock_offset; }

void sync_clock(MPI_Comm world) {
  // Ranks that share a host share the clock, so only the offset between hosts
  // is measured: each host's leader (its lowest rank) against world rank 0,
  // the reference, and the leader hands it to the ranks of its host. On one
  // host no offset is measured at all and the readings of all ranks are
  // exactly comparable.
  int world_rank = 0;
  MPI_CHECK(MPI_Comm_rank(world, &world_rank));
  MPI_Comm host_mpi, leaders_mpi;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &host_mpi));
  Communicator host(host_mpi, CommKind::world, "clock sync (host)", 60.0, true);
  const bool leader = host.rank() == 0;
  MPI_CHECK(MPI_Comm_split(world, leader ? 0 : MPI_UNDEFINED, world_rank, &leaders_mpi));
  double offset = 0.0;
  if (leader) {
    // Ordered by world rank: leaders' rank 0 is world rank 0.
    Communicator c(leaders_mpi, CommKind::world, "clock sync (hosts)", 60.0, true);
    // Each leader pings rank 0 a few times and keeps the exchange with the
    // shortest round trip (least queueing), taking rank 0's reading as taken
    // half-way through it.
    constexpr int kRounds = 8;
    constexpr int kTag = 7301;
    double best_rtt = 1e30;
    for (int r = 1; r < c.size(); ++r) {
      for (int k = 0; k < kRounds; ++k) {
        if (c.rank() == 0) {
          char ping = 0;
          Request rq = c.irecv(&ping, 1, r, kTag);
          c.wait(rq);
          const double t = monotonic_s();
          Request sq = c.isend(&t, sizeof t, r, kTag);
          c.wait(sq);
        } else if (c.rank() == r) {
          char ping = 1;
          double t_ref = 0;
          const double t0 = monotonic_s();
          Request sq = c.isend(&ping, 1, 0, kTag);
          Request rq = c.irecv(&t_ref, sizeof t_ref, 0, kTag);
          c.wait(sq);
          c.wait(rq);
          const double t1 = monotonic_s();
          if (t1 - t0 < best_rtt) {
            best_rtt = t1 - t0;
            offset = t_ref - 0.5 * (t0 + t1);
          }
        }
      }
    }
    c.barrier();
  }
  host.broadcast(&offset, sizeof offset, 0);
  g_clock_offset = offset;
}

}  // namespace trident
