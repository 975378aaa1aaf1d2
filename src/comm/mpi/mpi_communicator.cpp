// MpiCommunicator: each operation posted as a non-blocking MPI call whose
// request is polled by the common watchdog; byte-sized operations beyond
// INT_MAX go through a derived datatype, reductions in INT_MAX pieces.
#include "trident/comm/mpi/mpi_communicator.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_check.hpp"
#include "ordered_sum.hpp"
#include "trident/core/error.hpp"

namespace trident {

namespace {

// Largest element count handed to one typed MPI call.
constexpr size_t kMaxCount = size_t(INT_MAX);

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// An MPI request. Released while pending only when a wait was skipped (an
// exception unwound past it): a receive is cancelled so that no buffer is
// written after it is gone; a send is released and completes on its own.
class MpiRequest final : public PendingOp {
 public:
  explicit MpiRequest(bool is_recv) : is_recv_(is_recv) {}
  ~MpiRequest() override {
    if (req_ == MPI_REQUEST_NULL || mpi_finalized()) return;
    if (is_recv_) MPI_Cancel(&req_);
    MPI_Request_free(&req_);
  }
  bool poll() override {
    int done = 0;
    MPI_CHECK(MPI_Test(&req_, &done, MPI_STATUS_IGNORE));
    return done != 0;
  }
  MPI_Request* handle() { return &req_; }
  // Arguments MPI reads until the operation completes (an all-to-all-v's
  // counts and displacements): held as long as the request.
  void hold(std::vector<int> args) { held_ = std::move(args); }

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
  bool is_recv_;
  std::vector<int> held_;
};

// A datatype of exactly `bytes` bytes (count 1), so that sizes beyond INT_MAX
// need no int count: q blocks of 1 GiB followed by the remainder. The extent
// equals `bytes`, which allgather relies on to place each rank's block.
class ByteSpan {
 public:
  explicit ByteSpan(size_t bytes) {
    if (bytes <= kMaxCount) {
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

MPI_Datatype mpi_type(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return MPI_FLOAT;
    case ElemType::f64:
      return MPI_DOUBLE;
    case ElemType::i32:
      return MPI_INT;
    case ElemType::i64:
      return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_OP_NULL;
}

int rank_of(MPI_Comm comm) {
  TRIDENT_CHECK(comm != MPI_COMM_NULL, "Communicator built on MPI_COMM_NULL");
  int r = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &r));
  return r;
}

// World rank of each member of comm.
std::vector<int> world_ranks_of(MPI_Comm comm) {
  int size = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Group mine, world;
  MPI_CHECK(MPI_Comm_group(comm, &mine));
  MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> local(size_t(size), 0), out(size_t(size), 0);
  for (int i = 0; i < size; ++i) local[size_t(i)] = i;
  MPI_CHECK(MPI_Group_translate_ranks(mine, size, local.data(), world, out.data()));
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  return out;
}

// Counts or displacements of one all-to-all-v as MPI's ints, appended to out.
void append_int(const int64_t* v, size_t p, const std::string& where, const char* what,
                std::vector<int>& out) {
  for (size_t i = 0; i < p; ++i) {
    TRIDENT_CHECK(v[i] >= 0 && v[i] <= int64_t(INT_MAX), where + what + "[" + std::to_string(i) +
                                                             "] = " + std::to_string(v[i]) +
                                                             " elements is outside [0, INT_MAX]");
    out.push_back(int(v[i]));
  }
}

// ---- posting: one non-blocking MPI call per operation ----

std::unique_ptr<PendingOp> post_isend(MPI_Comm comm, const CommOp& op) {
  auto req = std::make_unique<MpiRequest>(false);
  ByteSpan span(op.bytes);
  MPI_CHECK(MPI_Isend(op.in, span.count(), span.type(), op.peer, op.tag, comm, req->handle()));
  return req;
}

std::unique_ptr<PendingOp> post_irecv(MPI_Comm comm, const CommOp& op) {
  auto req = std::make_unique<MpiRequest>(true);
  ByteSpan span(op.bytes);
  MPI_CHECK(MPI_Irecv(op.out, span.count(), span.type(), op.peer, op.tag, comm, req->handle()));
  return req;
}

std::unique_ptr<PendingOp> post_iallreduce(MPI_Comm comm, const CommOp& op) {
  auto req = std::make_unique<MpiRequest>(false);
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, op.out, int(op.count), mpi_type(op.type),
                           mpi_op(op.reduce), comm, req->handle()));
  return req;
}

std::unique_ptr<PendingOp> post_ireduce_scatter(MPI_Comm comm, const CommOp& op) {
  auto req = std::make_unique<MpiRequest>(false);
  MPI_CHECK(MPI_Ireduce_scatter_block(op.in, op.out, int(op.count), mpi_type(op.type),
                                      mpi_op(op.reduce), comm, req->handle()));
  return req;
}

// In place: the root reduces into its own data.
std::unique_ptr<PendingOp> post_ireduce(MPI_Comm comm, int rank, const CommOp& op) {
  auto req = std::make_unique<MpiRequest>(false);
  MPI_CHECK(MPI_Ireduce(rank == op.peer ? MPI_IN_PLACE : op.out, op.out, int(op.count),
                        mpi_type(op.type), mpi_op(op.reduce), op.peer, comm, req->handle()));
  return req;
}

std::unique_ptr<PendingOp> post_ibcast(MPI_Comm comm, const CommOp& op) {
  auto req = std::make_unique<MpiRequest>(false);
  ByteSpan span(op.bytes);
  MPI_CHECK(MPI_Ibcast(op.out, span.count(), span.type(), op.peer, comm, req->handle()));
  return req;
}

std::unique_ptr<PendingOp> post_iallgather(MPI_Comm comm, const CommOp& op) {
  auto req = std::make_unique<MpiRequest>(false);
  ByteSpan span(op.bytes);
  MPI_CHECK(MPI_Iallgather(op.in, span.count(), span.type(), op.out, span.count(), span.type(),
                           comm, req->handle()));
  return req;
}

// p: the group's size; where: the start of an error message.
std::unique_ptr<PendingOp> post_ialltoallv(MPI_Comm comm, size_t p, const std::string& where,
                                           const CommOp& op) {
  TRIDENT_CHECK(op.elem_bytes <= kMaxCount,
                where + "bad element size " + std::to_string(op.elem_bytes));
  // Counts are in elements of a contiguous type of elem_bytes, so the int
  // limit applies to elements (2^31 per peer), not to bytes.
  // MPI may read the count and displacement arrays until the operation
  // completes (the standard forbids freeing a non-blocking collective's
  // argument arrays before then), so the request owns them: sc|sd|rc|rd.
  std::vector<int> args;
  args.reserve(4 * p);
  append_int(op.send_counts, p, where, "send_counts", args);
  append_int(op.send_displs, p, where, "send_displs", args);
  append_int(op.recv_counts, p, where, "recv_counts", args);
  append_int(op.recv_displs, p, where, "recv_displs", args);
  MPI_Datatype elem;
  MPI_CHECK(MPI_Type_contiguous(int(op.elem_bytes), MPI_BYTE, &elem));
  MPI_CHECK(MPI_Type_commit(&elem));
  auto req = std::make_unique<MpiRequest>(false);
  const int* a = args.data();
  MPI_CHECK(MPI_Ialltoallv(op.in, a, a + p, elem, op.out, a + 2 * p, a + 3 * p, elem, comm,
                           req->handle()));
  req->hold(std::move(args));  // a moved vector keeps its storage
  MPI_Type_free(&elem);        // pending operations keep using a freed type
  return req;
}

std::unique_ptr<PendingOp> post_ibarrier(MPI_Comm comm) {
  auto req = std::make_unique<MpiRequest>(false);
  MPI_CHECK(MPI_Ibarrier(comm, req->handle()));
  return req;
}

// ---- staging: device buffers through host memory ----

// One buffer of an operation copied through host memory.
struct StagedBuffer {
  void* device = nullptr;  // where the data lives (null: not staged)
  HostBuffer host;         // the copy MPI reads or writes (the device's kind of host memory)
  size_t bytes = 0;
};

// An operation posted on host copies of its device buffers: the inputs were
// copied to the host before posting; the outputs are copied back to the
// device when MPI completes it. Released while pending, it leaks its host
// buffers, since MPI may still read or write them.
class StagedOp final : public PendingOp {
 public:
  StagedOp(DeviceStaging& staging, StagedBuffer in, StagedBuffer out)
      : staging_(staging), in_(std::move(in)), out_(std::move(out)) {}
  ~StagedOp() override {
    if (done_) return;
    (void)in_.host.release();
    (void)out_.host.release();
  }
  void start(std::unique_ptr<PendingOp> op) { op_ = std::move(op); }
  bool poll() override {
    if (done_) return true;
    if (!op_->poll()) return false;
    if (out_.device) staging_.to_device(out_.device, out_.host.get(), out_.bytes);
    done_ = true;
    return true;
  }

 private:
  DeviceStaging& staging_;
  StagedBuffer in_, out_;
  std::unique_ptr<PendingOp> op_;
  bool done_ = false;
};

// Extent in bytes of the blocks an all-to-all-v reads or writes.
size_t alltoallv_extent(const int64_t* counts, const int64_t* displs, size_t p, size_t elem) {
  int64_t end = 0;
  for (size_t i = 0; i < p; ++i)
    if (counts[i] > 0) end = std::max(end, displs[i] + counts[i]);
  return size_t(end) * elem;
}

// The bytes an operation reads from `in` and writes to `out` (allreduce and
// broadcast: in place, through out).
void op_extents(const CommOp& op, size_t p, size_t& in_bytes, size_t& out_bytes) {
  in_bytes = out_bytes = 0;
  switch (op.kind) {
    case CommOp::Kind::send:
      in_bytes = op.bytes;
      break;
    case CommOp::Kind::recv:
      out_bytes = op.bytes;
      break;
    case CommOp::Kind::allreduce:
    case CommOp::Kind::reduce:
      out_bytes = op.count * elem_size(op.type);
      break;
    case CommOp::Kind::broadcast:
      out_bytes = op.bytes;
      break;
    case CommOp::Kind::allgather:
      in_bytes = op.bytes;
      out_bytes = op.bytes * p;
      break;
    case CommOp::Kind::reduce_scatter:
      in_bytes = op.count * elem_size(op.type) * p;
      out_bytes = op.count * elem_size(op.type);
      break;
    case CommOp::Kind::alltoallv:
      in_bytes = alltoallv_extent(op.send_counts, op.send_displs, p, op.elem_bytes);
      out_bytes = alltoallv_extent(op.recv_counts, op.recv_displs, p, op.elem_bytes);
      break;
    case CommOp::Kind::barrier:
      break;
  }
}

// A host copy of [p, p + bytes) when p is on the staging device; `fill`:
// with the device's bytes (data the operation reads).
StagedBuffer stage(DeviceStaging& staging, const void* p, size_t bytes, bool fill) {
  StagedBuffer b;
  if (!p || bytes == 0 || !staging.on_device(p)) return b;
  b.device = const_cast<void*>(p);
  b.bytes = bytes;
  b.host = staging.host_buffer(bytes);
  if (fill)
    staging.to_host(b.host.get(), p, bytes);
  else  // what MPI leaves unwritten (gaps of an all-to-all-v) goes back as zeros
    std::memset(b.host.get(), 0, bytes);
  return b;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommKind kind, std::string name, double timeout_s,
                                 bool owned)
    : Communicator(kind, std::move(name), timeout_s, rank_of(comm), world_ranks_of(comm)),
      comm_(comm),
      owned_(owned) {
  MPI_CHECK(MPI_Comm_dup(comm_, &ordered_));
}

MpiCommunicator::~MpiCommunicator() {
  if (mpi_finalized()) return;
  if (ordered_ != MPI_COMM_NULL) MPI_Comm_free(&ordered_);
  if (owned_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

int MpiCommunicator::max_tag() const {
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
  return (flag && ub) ? *ub : 32767;  // 32767 is the least the MPI standard promises
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, CommKind kind,
                                                     std::string name) {
  // Splitting has no non-blocking form in MPI; a barrier with the deadline
  // first makes sure every rank has arrived, so the split cannot hang on a
  // missing rank.
  barrier();
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(comm_, color >= 0 ? color : MPI_UNDEFINED, key, &sub));
  if (sub == MPI_COMM_NULL) return nullptr;
  auto group = std::make_unique<MpiCommunicator>(sub, kind, std::move(name), timeout_s(), true);
  group->staging_ = staging_;
  group->share_counters(*this);
  return group;
}

std::unique_ptr<Communicator> MpiCommunicator::split_node(CommKind kind, std::string name) {
  barrier();
  MPI_Comm sub = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank(), MPI_INFO_NULL, &sub));
  auto group = std::make_unique<MpiCommunicator>(sub, kind, std::move(name), timeout_s(), true);
  group->staging_ = staging_;
  group->share_counters(*this);
  return group;
}

// ---- posting ----

size_t MpiCommunicator::max_elements_per_reduction() const { return kMaxCount; }

std::unique_ptr<PendingOp> MpiCommunicator::post(const CommOp& op) {
  if (!staging_) return post_host(op);
  size_t in_bytes = 0, out_bytes = 0;
  op_extents(op, size_t(size()), in_bytes, out_bytes);
  StagedBuffer in = stage(*staging_, op.in, in_bytes, true);
  // in place (allreduce, broadcast): the device's data goes out and comes back
  const bool in_place = op.kind == CommOp::Kind::allreduce || op.kind == CommOp::Kind::broadcast ||
                        op.kind == CommOp::Kind::reduce;
  StagedBuffer out = stage(*staging_, op.out, out_bytes, in_place);
  if (!in.device && !out.device) return post_host(op);
  CommOp host_op = op;
  if (in.device) host_op.in = in.host.get();
  if (out.device) host_op.out = out.host.get();
  auto staged = std::make_unique<StagedOp>(*staging_, std::move(in), std::move(out));
  staged->start(post_host(host_op));
  return staged;
}

namespace {

// Over two ranks every bracketing is the same sum, and MPI's is faster.
bool ordered_sum_applies(const CommOp& op, int size) {
  const bool reduction = op.kind == CommOp::Kind::allreduce || op.kind == CommOp::Kind::reduce ||
                         op.kind == CommOp::Kind::reduce_scatter;
  return reduction && op.order == SumOrder::rank && op.type == ElemType::f32 &&
         op.reduce == ReduceOp::sum && size > 2;
}

// The rank-ordered sum's arguments for op; tag_base is this op's tag block.
detail::OrderedSumArgs ordered_sum_args(const CommOp& op, MPI_Comm ordered, int rank, int size,
                                        int tag_base) {
  using Mode = detail::OrderedSumArgs::Mode;
  detail::OrderedSumArgs a;
  a.comm = ordered;
  a.rank = rank;
  a.size = size;
  a.tag_base = tag_base;
  a.mode = op.kind == CommOp::Kind::allreduce ? Mode::all
           : op.kind == CommOp::Kind::reduce  ? Mode::root
                                              : Mode::scatter;
  a.in = op.kind == CommOp::Kind::reduce_scatter ? static_cast<const float*>(op.in)
                                                 : static_cast<const float*>(op.out);
  a.out = static_cast<float*>(op.out);
  a.n = op.kind == CommOp::Kind::reduce_scatter ? op.count * size_t(size) : op.count;
  a.block = op.count;
  a.root = op.peer;
  return a;
}

// MPI's own nonblocking operation for op.
std::unique_ptr<PendingOp> post_native(const MpiCommunicator& self, const CommOp& op) {
  MPI_Comm comm = self.native();
  switch (op.kind) {
    case CommOp::Kind::send:
      return post_isend(comm, op);
    case CommOp::Kind::recv:
      return post_irecv(comm, op);
    case CommOp::Kind::allreduce:
      return post_iallreduce(comm, op);
    case CommOp::Kind::broadcast:
      return post_ibcast(comm, op);
    case CommOp::Kind::allgather:
      return post_iallgather(comm, op);
    case CommOp::Kind::alltoallv:
      return post_ialltoallv(comm, size_t(self.size()), "alltoallv on " + self.name() + ": ", op);
    case CommOp::Kind::barrier:
      return post_ibarrier(comm);
    case CommOp::Kind::reduce_scatter:
      return post_ireduce_scatter(comm, op);
    case CommOp::Kind::reduce:
      return post_ireduce(comm, self.rank(), op);
  }
  throw Error("MpiCommunicator: unknown operation kind " + std::to_string(int(op.kind)));
}

}  // namespace

std::unique_ptr<PendingOp> MpiCommunicator::post_host(const CommOp& op) {
  if (ordered_sum_applies(op, size())) {
    // Every rank posts the same sequence of collectives, so the count agrees.
    const uint64_t slots = uint64_t(max_tag() / detail::kOrderedTagsPerOp);
    const int tag_base = int(ordered_posted_++ % slots) * detail::kOrderedTagsPerOp;
    return detail::post_ordered_sum(ordered_sum_args(op, ordered_, rank(), size(), tag_base));
  }
  return post_native(*this, op);
}

MpiHandles mpi_handles(const Communicator& c) {
  const auto* m = dynamic_cast<const MpiCommunicator*>(&c.host());
  TRIDENT_CHECK(m != nullptr, "communicator '" + c.name() + "' has no MPI host group");
  return {m->native(), MPI_INFO_NULL};
}

}  // namespace trident
