// RunFile: the run's HDF5 file, written by all ranks through parallel HDF5
// (MPI-IO driver). Layout: share/trident/hdf5-layout.md.
//
// Parallel HDF5's rule shapes this file: every call that changes metadata
// (create, extend, attribute) is made by every rank with the same arguments,
// so arguments are checked to agree across ranks *before* the first such
// call, and every rank throws the same error when they do not. Raw data is
// written by the ranks that own it.
#include "trident/io/run_file.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <limits>
#include <numeric>
#include <type_traits>
#include <utility>

// The MPI communicator under world, for parallel HDF5's file driver only.
#include "trident/comm/mpi/mpi_communicator.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/allocator.hpp"
#include "trident/core/error.hpp"
#include "trident/io/h5util.hpp"

namespace trident {

namespace {

using h5::Handle;

constexpr size_t kKindBytes = 16;      // timeline event kind, NUL included
constexpr size_t kHostnameBytes = 64;  // /topology/ranks hostname, NUL included
constexpr size_t kDetailBytes = 1024;  // /events detail, NUL included (96 before version 3)
constexpr hsize_t kStepChunk = 256;
constexpr hsize_t kEventChunk = 1024;
const std::vector<std::string> kCommColumns = {"cp", "pp", "ep", "dp"};

// One row of /topology/ranks.
struct RankRow {
  int32_t rank, logical, node, local_rank, device, pp, dp, cp, ep, ep_group;
  char hostname[kHostnameBytes];
};

// One row of /timeline/events.
struct EventRow {
  int32_t rank;
  int64_t step;
  char kind[kKindBytes];
  int32_t stage, chunk, microbatch;
  double t_begin_s, t_end_s;
};

// One row of /events.
struct RunEventRow {
  int64_t step;
  char kind[kKindBytes];
  int32_t rank;
  double value, reference;
  char detail[kDetailBytes];
};

// The file keeps a packed copy of the memory layout (no padding bytes).
Handle packed(const Handle& mem) {
  Handle t = TRIDENT_H5_TYPE(H5Tcopy(mem), "copy compound type");
  TRIDENT_H5(H5Tpack(t), "pack compound type");
  return t;
}

Handle compound(size_t size) {
  return TRIDENT_H5_TYPE(H5Tcreate(H5T_COMPOUND, size), "create compound type");
}

void member(hid_t t, const char* name, size_t offset, hid_t type) {
  TRIDENT_H5(H5Tinsert(t, name, offset, type), std::string("compound member ") + name);
}

Handle step_type() {
  Handle t = compound(sizeof(StepMetrics));
  member(t, "step", offsetof(StepMetrics, step), H5T_NATIVE_INT64);
  member(t, "loss", offsetof(StepMetrics, loss), H5T_NATIVE_DOUBLE);
  member(t, "aux_loss", offsetof(StepMetrics, aux_loss), H5T_NATIVE_DOUBLE);
  member(t, "z_loss", offsetof(StepMetrics, z_loss), H5T_NATIVE_DOUBLE);
  member(t, "lr", offsetof(StepMetrics, lr), H5T_NATIVE_DOUBLE);
  member(t, "grad_norm", offsetof(StepMetrics, grad_norm), H5T_NATIVE_DOUBLE);
  member(t, "step_time_s", offsetof(StepMetrics, step_time_s), H5T_NATIVE_DOUBLE);
  member(t, "tokens_per_s", offsetof(StepMetrics, tokens_per_s), H5T_NATIVE_DOUBLE);
  member(t, "bubble_fraction", offsetof(StepMetrics, bubble_fraction), H5T_NATIVE_DOUBLE);
  return t;
}

Handle eval_type() {
  Handle t = compound(sizeof(EvalMetrics));
  member(t, "step", offsetof(EvalMetrics, step), H5T_NATIVE_INT64);
  member(t, "loss", offsetof(EvalMetrics, loss), H5T_NATIVE_DOUBLE);
  member(t, "perplexity", offsetof(EvalMetrics, perplexity), H5T_NATIVE_DOUBLE);
  member(t, "targets", offsetof(EvalMetrics, targets), H5T_NATIVE_INT64);
  return t;
}

Handle checkpoint_type() {
  Handle t = compound(sizeof(CheckpointRecord));
  member(t, "step", offsetof(CheckpointRecord, step), H5T_NATIVE_INT64);
  member(t, "blocking_s", offsetof(CheckpointRecord, blocking_s), H5T_NATIVE_DOUBLE);
  member(t, "write_s", offsetof(CheckpointRecord, write_s), H5T_NATIVE_DOUBLE);
  member(t, "bytes", offsetof(CheckpointRecord, bytes), H5T_NATIVE_INT64);
  member(t, "slowest_rank", offsetof(CheckpointRecord, slowest_rank), H5T_NATIVE_INT32);
  member(t, "async", offsetof(CheckpointRecord, async), H5T_NATIVE_INT32);
  member(t, "local", offsetof(CheckpointRecord, local), H5T_NATIVE_INT32);
  return t;
}

Handle rank_row_type() {
  Handle t = compound(sizeof(RankRow));
  member(t, "rank", offsetof(RankRow, rank), H5T_NATIVE_INT32);
  member(t, "logical", offsetof(RankRow, logical), H5T_NATIVE_INT32);
  member(t, "node", offsetof(RankRow, node), H5T_NATIVE_INT32);
  member(t, "local_rank", offsetof(RankRow, local_rank), H5T_NATIVE_INT32);
  member(t, "device", offsetof(RankRow, device), H5T_NATIVE_INT32);
  member(t, "pp", offsetof(RankRow, pp), H5T_NATIVE_INT32);
  member(t, "dp", offsetof(RankRow, dp), H5T_NATIVE_INT32);
  member(t, "cp", offsetof(RankRow, cp), H5T_NATIVE_INT32);
  member(t, "ep", offsetof(RankRow, ep), H5T_NATIVE_INT32);
  member(t, "ep_group", offsetof(RankRow, ep_group), H5T_NATIVE_INT32);
  Handle s = h5::fixed_string_type(kHostnameBytes);
  member(t, "hostname", offsetof(RankRow, hostname), s);
  return t;
}

Handle event_type() {
  Handle t = compound(sizeof(EventRow));
  member(t, "rank", offsetof(EventRow, rank), H5T_NATIVE_INT32);
  member(t, "step", offsetof(EventRow, step), H5T_NATIVE_INT64);
  Handle s = h5::fixed_string_type(kKindBytes);
  member(t, "kind", offsetof(EventRow, kind), s);
  member(t, "stage", offsetof(EventRow, stage), H5T_NATIVE_INT32);
  member(t, "chunk", offsetof(EventRow, chunk), H5T_NATIVE_INT32);
  member(t, "microbatch", offsetof(EventRow, microbatch), H5T_NATIVE_INT32);
  member(t, "t_begin_s", offsetof(EventRow, t_begin_s), H5T_NATIVE_DOUBLE);
  member(t, "t_end_s", offsetof(EventRow, t_end_s), H5T_NATIVE_DOUBLE);
  return t;
}

Handle run_event_type() {
  Handle t = compound(sizeof(RunEventRow));
  member(t, "step", offsetof(RunEventRow, step), H5T_NATIVE_INT64);
  Handle k = h5::fixed_string_type(kKindBytes);
  member(t, "kind", offsetof(RunEventRow, kind), k);
  member(t, "rank", offsetof(RunEventRow, rank), H5T_NATIVE_INT32);
  member(t, "value", offsetof(RunEventRow, value), H5T_NATIVE_DOUBLE);
  member(t, "reference", offsetof(RunEventRow, reference), H5T_NATIVE_DOUBLE);
  Handle d = h5::fixed_string_type(kDetailBytes);
  member(t, "detail", offsetof(RunEventRow, detail), d);
  return t;
}

Handle summary_type() {
  Handle t = compound(sizeof(RankSummary));
  member(t, "rank", offsetof(RankSummary, rank), H5T_NATIVE_INT32);
  member(t, "peak_rss_bytes", offsetof(RankSummary, peak_rss_bytes), H5T_NATIVE_DOUBLE);
  member(t, "peak_device_bytes", offsetof(RankSummary, peak_device_bytes), H5T_NATIVE_DOUBLE);
  member(t, "peak_alloc_bytes", offsetof(RankSummary, peak_alloc_bytes), H5T_NATIVE_DOUBLE);
  member(t, "compute_s", offsetof(RankSummary, compute_s), H5T_NATIVE_DOUBLE);
  hsize_t four[1] = {4};
  Handle arr = TRIDENT_H5_TYPE(H5Tarray_create2(H5T_NATIVE_DOUBLE, 1, four), "array type");
  member(t, "comm_wait_s", offsetof(RankSummary, comm_wait_s), arr);
  static_assert(kNumMemKinds == 6, "one member per MemKind");
  for (int k = 0; k < kNumMemKinds; ++k)
    member(t, (std::string("peak_") + mem_kind_name(MemKind(k)) + "_bytes").c_str(),
           offsetof(RankSummary, peak_kind_bytes) + size_t(k) * sizeof(double), H5T_NATIVE_DOUBLE);
  return t;
}

// A float64 array member of n elements.
void array_member(hid_t t, const char* name, size_t offset, hsize_t n) {
  Handle arr = TRIDENT_H5_TYPE(H5Tarray_create2(H5T_NATIVE_DOUBLE, 1, &n), "array type");
  member(t, name, offset, arr);
}

Handle rank_step_type() {
  using R = RankStepRow;
  Handle t = compound(sizeof(R));
  member(t, "step", offsetof(R, step), H5T_NATIVE_INT64);
  member(t, "steps", offsetof(R, steps), H5T_NATIVE_INT32);
  member(t, "rank", offsetof(R, rank), H5T_NATIVE_INT32);
  Handle s = h5::fixed_string_type(sizeof(R::host));
  member(t, "host", offsetof(R, host), s);
  member(t, "stage", offsetof(R, stage), H5T_NATIVE_INT32);
  array_member(t, "compute_s", offsetof(R, compute_s), 6);
  array_member(t, "wait_s", offsetof(R, wait_s), 4);
  member(t, "peer", offsetof(R, peer), H5T_NATIVE_INT32);
  const std::pair<const char*, size_t> doubles[] = {
      {"peer_wait_s", offsetof(R, peer_wait_s)}, {"step_s", offsetof(R, step_s)},
      {"waited_on_s", offsetof(R, waited_on_s)}, {"score", offsetof(R, score)},
      {"score_best", offsetof(R, score_best)},   {"score_self", offsetof(R, score_self)}};
  for (const auto& [name, offset] : doubles) member(t, name, offset, H5T_NATIVE_DOUBLE);
  return t;
}

Handle simple_space(const std::vector<hsize_t>& dims, const std::vector<hsize_t>& maxdims = {}) {
  return TRIDENT_H5_SPACE(H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                           maxdims.empty() ? nullptr : maxdims.data()),
                          "create dataspace");
}

Handle collective_xfer() {
  Handle p = TRIDENT_H5_PLIST(H5Pcreate(H5P_DATASET_XFER), "transfer property list");
  TRIDENT_H5(H5Pset_dxpl_mpio(p, H5FD_MPIO_COLLECTIVE), "collective transfer");
  return p;
}

// An extendible dataset whose leading dimension starts at 0 and grows by rows.
Handle create_extendible(hid_t loc, const std::string& name, hid_t file_type,
                         const std::vector<hsize_t>& row_dims, hsize_t chunk_rows) {
  std::vector<hsize_t> dims = {0}, maxdims = {H5S_UNLIMITED}, chunk = {chunk_rows};
  for (hsize_t d : row_dims) {
    dims.push_back(d);
    maxdims.push_back(d);
    chunk.push_back(std::max<hsize_t>(d, 1));
  }
  Handle space = simple_space(dims, maxdims);
  Handle dcpl = TRIDENT_H5_PLIST(H5Pcreate(H5P_DATASET_CREATE), "dataset creation list");
  TRIDENT_H5(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), "chunk " + name);
  // Parallel HDF5 allocates space collectively; early allocation keeps
  // rank 0's independent row writes away from allocation.
  TRIDENT_H5(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), "allocation time " + name);
  return TRIDENT_H5_DSET(
      H5Dcreate2(loc, name.c_str(), file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
      "create dataset " + name);
}

Handle open_dataset(hid_t loc, const std::string& name) {
  return TRIDENT_H5_DSET(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), "open dataset " + name);
}

// Grows the leading dimension of an extendible dataset to `rows` (collective).
void extend_rows(hid_t dset, hsize_t rows) {
  Handle space = TRIDENT_H5_SPACE(H5Dget_space(dset), "dataset space");
  int nd = TRIDENT_H5(H5Sget_simple_extent_ndims(space), "dataset rank");
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  TRIDENT_H5(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "dataset dims");
  dims[0] = rows;
  TRIDENT_H5(H5Dset_extent(dset, dims.data()), "extend dataset");
}

// A file-space selection of rows [first, first+count) of a dataset.
Handle select_rows(hid_t dset, hsize_t first, hsize_t count) {
  Handle space = TRIDENT_H5_SPACE(H5Dget_space(dset), "dataset space");
  int nd = TRIDENT_H5(H5Sget_simple_extent_ndims(space), "dataset rank");
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  TRIDENT_H5(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "dataset dims");
  if (count == 0) {
    TRIDENT_H5(H5Sselect_none(space), "select none");
    return space;
  }
  std::vector<hsize_t> start(dims.size(), 0), cnt = dims;
  start[0] = first;
  cnt[0] = count;
  TRIDENT_H5(H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, cnt.data(), nullptr),
             "select rows");
  return space;
}

// A memory space of `count` rows shaped like the dataset's rows (none if 0).
Handle memory_rows(hid_t dset, hsize_t count) {
  Handle space = TRIDENT_H5_SPACE(H5Dget_space(dset), "dataset space");
  int nd = TRIDENT_H5(H5Sget_simple_extent_ndims(space), "dataset rank");
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  TRIDENT_H5(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "dataset dims");
  dims[0] = std::max<hsize_t>(count, 1);
  Handle mem = simple_space(dims);
  if (count == 0) TRIDENT_H5(H5Sselect_none(mem), "select none");
  return mem;
}

// Appends one row to the extendible table `name` (collective): every rank
// grows it, rank 0 writes `row` of memory type mtype at index `index`.
void append_row(hid_t file, int rank, const char* name, int64_t index, hid_t mtype,
                const void* row) {
  Handle ds = open_dataset(file, name);
  extend_rows(ds, static_cast<hsize_t>(index + 1));
  if (rank != 0) return;
  Handle fsel = select_rows(ds, static_cast<hsize_t>(index), 1);
  Handle mem = memory_rows(ds, 1);
  TRIDENT_H5(H5Dwrite(ds, mtype, mem, fsel, H5P_DEFAULT, row), std::string("write /") + name);
}

// Root's string on every rank (attribute values must be identical).
std::string bcast_from(int root, const std::string& s, Communicator& comm) {
  return broadcast_string(comm, s, root);
}

// Every rank learns whether all ranks passed their checks, and all throw the
// first failing rank's message (printed by that rank); no rank enters a
// collective HDF5 call that another rank will never reach.
void agree_or_throw(bool ok, const std::string& my_msg, Communicator& comm,
                    bool input_error = false) {
  const CheckOutcome c = agree_on_check(comm, ok, my_msg);
  if (c.all_passed) return;
  if (input_error) throw InputError(c.message);
  throw AgreedError("run file: rank " + std::to_string(c.rank) + ": " + c.message,
                    comm.rank() == c.rank);
}

}  // namespace

namespace {

// True on every rank iff every rank passed the same vector.
bool same_on_all_ranks(const std::vector<int64_t>& v, Communicator& comm) {
  int64_t r[2] = {static_cast<int64_t>(v.size()), -static_cast<int64_t>(v.size())};
  comm.allreduce_max(r, 2);
  if (r[0] != -r[1]) return false;
  std::vector<int64_t> mn(v), mx(v);
  comm.allreduce_min(mn.data(), mn.size());
  comm.allreduce_max(mx.data(), mx.size());
  return mn == mx;
}

// Stable 63-bit hash of a name, so names can join same_on_all_ranks().
int64_t name_key(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

// Why path cannot be created for writing (strerror), or "".
std::string cannot_create(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::strerror(errno);
  ::close(fd);
  return "";
}

// The system's reason why path takes no more data, or "" when it sees none:
// the file cannot be opened for writing (read-only file system, permission,
// gone) or its file system has no free block left.
std::string system_refusal(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return std::strerror(errno);
  struct statvfs fs {};
  const bool known = ::fstatvfs(fd, &fs) == 0;
  ::close(fd);
  if (!known) return "";
  if (fs.f_flag & ST_RDONLY) return std::strerror(EROFS);
  // root may use the blocks reserved for it, others may not
  if ((::geteuid() == 0 ? fs.f_bfree : fs.f_bavail) == 0) return std::strerror(ENOSPC);
  return "";
}

// A write that HDF5 refused in the middle of a run, as one line naming the
// file, the object and the system's reason: MPI-IO's message does not carry
// errno, so the system is asked; HDF5's own text when it has no reason.
[[noreturn]] void throw_write_failure(const std::string& path, const h5::Failure& failure) {
  const std::string why = system_refusal(path);
  throw Error("output file " + path + ": cannot " + failure.done + ": " +
              (why.empty() ? failure.library_text : why));
}

void copy_cstr(char* dst, size_t cap, const std::string& src) {
  std::memset(dst, 0, cap);
  std::memcpy(dst, src.data(), std::min(src.size(), cap - 1));
}

}  // namespace

namespace {

// Creates the file on every rank, collectively, or throws one agreed error
// naming it and the system's reason.
hid_t create_run_file(const std::string& path, Communicator& world) {
  // HDF5's MPI-IO message does not carry the system's reason: rank 0 asks
  // the system first.
  std::string why;
  if (world.rank() == 0) why = cannot_create(path);
  agree_or_throw(why.empty(), "output file " + path + ": cannot create it: " + why, world, true);
  Handle fapl = TRIDENT_H5_PLIST(H5Pcreate(H5P_FILE_ACCESS), "file access list");
  const MpiHandles mpi = mpi_handles(world);
  TRIDENT_H5(H5Pset_fapl_mpio(fapl, mpi.comm, mpi.info), "MPI-IO driver");
  TRIDENT_H5(H5Pset_all_coll_metadata_ops(fapl, true), "collective metadata reads");
  TRIDENT_H5(H5Pset_coll_metadata_write(fapl, true), "collective metadata writes");
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  agree_or_throw(f >= 0,
                 "output file " + path + ": cannot create it (" + h5::error_text() +
                     "); the directory must exist and be writable",
                 world, true);
  H5Eclear2(H5E_DEFAULT);
  return f;
}

// Root attributes: values that differ between ranks (clock, environment)
// are rank 0's.
void write_root_attributes(hid_t file, Communicator& world, const Config& cfg,
                           const std::string& slurm_job_id) {
  const std::string created = bcast_from(0, h5::utc_iso8601_now(), world);
  const std::string job = bcast_from(0, slurm_job_id, world);
  const std::string toml = bcast_from(0, to_toml(cfg), world);
  h5::write_attr(file, "format", "trident-run");
  h5::write_attr(file, "format_version", int64_t{3});
  h5::write_attr(file, "trident_version", TRIDENT_VERSION);
  h5::write_attr(file, "config_toml", toml);
  h5::write_attr(file, "created_utc", created);
  h5::write_attr(file, "world_size", int64_t{world.size()});
  h5::write_attr(file, "slurm_job_id", job);
  h5::write_attr(file, "completed", int64_t{0});
}

// /topology: the shape and mesh as attributes, and each rank's own row of
// /topology/ranks (a rank knows its coordinates without recomputing the mesh
// for everyone).
void write_topology(hid_t file, Communicator& world, const Config& cfg,
                    const Communicators& comms) {
  Handle topo = h5::open_or_create_group(file, "topology");
  const ClusterShape& shape = comms.topo.shape;
  h5::write_attr(topo, "nodes", int64_t{shape.nodes});
  h5::write_attr(topo, "ranks_per_node", int64_t{shape.devices_per_node});
  h5::write_attr(topo, "nvlink_domain", int64_t{shape.nvlink_domain});
  h5::write_attr(topo, "source", bcast_from(0, comms.topo.source, world));
  h5::write_attr(topo, "pp", int64_t{comms.mesh.pp});
  h5::write_attr(topo, "dp", int64_t{comms.mesh.dp});
  h5::write_attr(topo, "cp", int64_t{comms.mesh.cp});
  h5::write_attr(topo, "ep", int64_t{comms.mesh.ep});
  h5::write_attr(topo, "vpp", int64_t{cfg.parallel.vpp});

  const int rank = world.rank();
  Handle mtype = rank_row_type();
  Handle ftype = packed(mtype);
  Handle space = simple_space({static_cast<hsize_t>(world.size())});
  Handle dset = TRIDENT_H5_DSET(
      H5Dcreate2(topo, "ranks", ftype, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
      "create /topology/ranks");
  const RankInfo& info = comms.topo.ranks[static_cast<size_t>(rank)];
  RankRow row{};
  row.rank = rank;
  row.logical = info.logical;
  row.node = info.node;
  row.local_rank = info.local_rank;
  row.device = info.device;
  row.pp = comms.me.pp;
  row.dp = comms.me.dp;
  row.cp = comms.me.cp;
  row.ep = comms.me.ep;
  row.ep_group = comms.me.ep_group;
  copy_cstr(row.hostname, sizeof row.hostname, info.hostname);
  Handle fsel = select_rows(dset, static_cast<hsize_t>(rank), 1);
  Handle mem = memory_rows(dset, 1);
  Handle xfer = collective_xfer();
  TRIDENT_H5(H5Dwrite(dset, mtype, mem, fsel, xfer, &row), "write /topology/ranks");
}

// The extendible datasets the run appends to: /metrics (steps, comm bytes,
// expert tokens of the MoE layers moe_ids), /timeline/events and /events.
void create_run_datasets(hid_t file, const std::vector<int64_t>& moe_ids, int n_experts) {
  {
    Handle metrics = h5::open_or_create_group(file, "metrics");
    Handle st = step_type();
    Handle st_file = packed(st);
    create_extendible(metrics, "steps", st_file, {}, kStepChunk);
    Handle ev = eval_type();
    Handle ev_file = packed(ev);
    create_extendible(metrics, "eval", ev_file, {}, kStepChunk);
    Handle ck = checkpoint_type();
    Handle ck_file = packed(ck);
    create_extendible(metrics, "checkpoints", ck_file, {}, kStepChunk);
    Handle cb = create_extendible(metrics, "comm_bytes", H5T_IEEE_F64LE, {4}, kStepChunk);
    h5::write_attr(cb, "columns", kCommColumns);
    h5::write_attr(cb, "units", "bytes");
    if (!moe_ids.empty()) {
      Handle et = create_extendible(
          metrics, "expert_tokens", H5T_STD_I64LE,
          {static_cast<hsize_t>(moe_ids.size()), static_cast<hsize_t>(n_experts)}, 16);
      h5::write_attr(et, "moe_layer_ids", moe_ids);
    }
  }
  {
    Handle timeline = h5::open_or_create_group(file, "timeline");
    Handle et = event_type();
    Handle et_file = packed(et);
    Handle ev = create_extendible(timeline, "events", et_file, {}, kEventChunk);
    h5::write_attr(ev, "clock", "seconds, one clock for all ranks (trident::now_s)");
  }
  Handle et = run_event_type();
  Handle et_file = packed(et);
  create_extendible(file, "events", et_file, {}, kStepChunk);
  h5::open_or_create_group(file, "activations");
}

}  // namespace

RunFile::RunFile(const std::string& path, Communicator& world, const Config& cfg,
                 const Communicators& comms, const std::string& slurm_job_id)
    : path_(path), world_(world.host()) {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  rank_ = world_.rank();
  size_ = world_.size();
  h5::QuietErrors quiet;

  const bool has_topo_row = static_cast<int>(comms.topo.ranks.size()) > rank_;
  agree_or_throw(has_topo_row,
                 "topology lists " + std::to_string(comms.topo.ranks.size()) +
                     " ranks, fewer than the world's " + std::to_string(size_),
                 world_);

  std::vector<int64_t> moe_ids;
  for (int l = 0; l < cfg.model.n_layers; ++l)
    if (cfg.model.is_moe_layer(l)) moe_ids.push_back(l);
  moe_layers_ = static_cast<int>(moe_ids.size());
  n_experts_ = moe_layers_ > 0 ? cfg.model.n_experts : 0;

  file_ = create_run_file(path_, world_);
  write_root_attributes(file_, world_, cfg, slurm_job_id);
  write_topology(file_, world_, cfg, comms);
  create_run_datasets(file_, moe_ids, n_experts_);
  flush();
}

RunFile::~RunFile() {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  if (closed_ || file_ < 0) return;
  // H5Fclose is collective. While an exception unwinds, other ranks may be
  // elsewhere, so the file is left as last flushed (completed = 0); HDF5
  // closes it when MPI is finalised or the process simply ends.
  if (std::uncaught_exceptions() > 0) return;
  h5::QuietErrors quiet;
  H5Fclose(file_);
  file_ = -1;
}

void RunFile::append_step(const StepMetrics& m, const std::array<double, 4>& comm_bytes,
                          const std::vector<std::vector<int64_t>>& expert_tokens) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": append_step after close");
  h5::QuietErrors quiet;
  bool ok = true;
  std::string msg;
  if (rank_ == 0) {
    ok = static_cast<int>(expert_tokens.size()) == moe_layers_;
    for (const auto& layer : expert_tokens) ok = ok && static_cast<int>(layer.size()) == n_experts_;
    if (!ok)
      msg = "expert_tokens must be [" + std::to_string(moe_layers_) + " moe layers][" +
            std::to_string(n_experts_) + " experts]";
  }
  agree_or_throw(ok, msg, world_);

  const hsize_t row = static_cast<hsize_t>(steps_);
  Handle metrics = TRIDENT_H5_GROUP(H5Gopen2(file_, "metrics", H5P_DEFAULT), "open /metrics");
  Handle steps = open_dataset(metrics, "steps");
  Handle cb = open_dataset(metrics, "comm_bytes");
  Handle et;
  extend_rows(steps, row + 1);
  extend_rows(cb, row + 1);
  if (moe_layers_ > 0) {
    et = open_dataset(metrics, "expert_tokens");
    extend_rows(et, row + 1);
  }
  if (rank_ == 0) {
    Handle st = step_type();
    Handle fsel = select_rows(steps, row, 1);
    Handle mem = memory_rows(steps, 1);
    TRIDENT_H5(H5Dwrite(steps, st, mem, fsel, H5P_DEFAULT, &m), "write /metrics/steps");
    Handle cbsel = select_rows(cb, row, 1);
    Handle cbmem = memory_rows(cb, 1);
    TRIDENT_H5(H5Dwrite(cb, H5T_NATIVE_DOUBLE, cbmem, cbsel, H5P_DEFAULT, comm_bytes.data()),
               "write /metrics/comm_bytes");
    if (moe_layers_ > 0) {
      std::vector<int64_t> flat;
      for (const auto& layer : expert_tokens) flat.insert(flat.end(), layer.begin(), layer.end());
      Handle esel = select_rows(et, row, 1);
      Handle emem = memory_rows(et, 1);
      TRIDENT_H5(H5Dwrite(et, H5T_NATIVE_INT64, emem, esel, H5P_DEFAULT, flat.data()),
                 "write /metrics/expert_tokens");
    }
  }
  steps_ += 1;
  flush();
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

void RunFile::append_events(const std::vector<TimelineEvent>& mine) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": append_events after close");
  h5::QuietErrors quiet;
  std::vector<EventRow> rows(mine.size());
  bool ok = true;
  std::string msg;
  for (size_t i = 0; i < mine.size(); ++i) {
    const TimelineEvent& e = mine[i];
    if (e.kind.empty() || e.kind.size() >= kKindBytes) {
      ok = false;
      msg = "timeline event kind '" + e.kind + "' must have 1 to " +
            std::to_string(kKindBytes - 1) + " characters";
      break;
    }
    EventRow& r = rows[i];
    r.rank = e.rank;
    r.step = e.step;
    copy_cstr(r.kind, sizeof r.kind, e.kind);
    r.stage = e.stage;
    r.chunk = e.chunk;
    r.microbatch = e.microbatch;
    r.t_begin_s = e.t_begin_s;
    r.t_end_s = e.t_end_s;
  }
  agree_or_throw(ok, msg, world_);

  int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int64_t> counts(static_cast<size_t>(size_));
  world_.allgather(&n, counts.data(), sizeof n);
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  if (total == 0) return;
  const int64_t offset =
      events_ + std::accumulate(counts.begin(), counts.begin() + rank_, int64_t{0});

  Handle ev =
      TRIDENT_H5_DSET(H5Dopen2(file_, "timeline/events", H5P_DEFAULT), "open /timeline/events");
  extend_rows(ev, static_cast<hsize_t>(events_ + total));
  Handle mtype = event_type();
  Handle fsel = select_rows(ev, static_cast<hsize_t>(offset), static_cast<hsize_t>(n));
  Handle mem = memory_rows(ev, static_cast<hsize_t>(n));
  Handle xfer = collective_xfer();
  TRIDENT_H5(H5Dwrite(ev, mtype, mem, fsel, xfer, rows.empty() ? nullptr : rows.data()),
             "write /timeline/events");
  events_ += total;
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

namespace {

// Why an activation write is invalid ("" if it is not); order: the local
// rows sorted by global position.
std::string activation_problem(const std::vector<int64_t>& global_shape,
                               const std::vector<int>& sample_ids, const float* local,
                               const std::vector<int64_t>& global_positions,
                               const std::vector<size_t>& order, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos) return "name must be non-empty, no '/'";
  if (global_shape.size() < 2) return "global_shape must be [S, seq, ...]";
  for (int64_t d : global_shape)
    if (d <= 0) return "every dimension of global_shape must be positive";
  if (global_shape[0] != static_cast<int64_t>(sample_ids.size()))
    return "global_shape[0] must equal the number of sample_ids";
  const int64_t seq = global_shape[1];
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t p = global_positions[order[i]];
    if (p < 0 || p >= seq) return "position " + std::to_string(p) + " outside [0, seq)";
    if (i > 0 && global_positions[order[i - 1]] == p)
      return "position " + std::to_string(p) + " given twice";
  }
  if (!global_positions.empty() && local == nullptr) return "local data is null";
  return "";
}

// The dataset, NaN-filled so that a position no rank wrote shows as a gap.
Handle create_activation(hid_t group, const std::string& name, const std::string& where,
                         const std::vector<hsize_t>& dims, const std::vector<int>& sample_ids) {
  Handle fspace = simple_space(dims);
  Handle dcpl = TRIDENT_H5_PLIST(H5Pcreate(H5P_DATASET_CREATE), "dataset creation list");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  TRIDENT_H5(H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan), "fill value");
  TRIDENT_H5(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), "allocation time");
  TRIDENT_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_ALLOC), "fill time");
  Handle dset = TRIDENT_H5_DSET(
      H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, fspace, H5P_DEFAULT, dcpl, H5P_DEFAULT),
      "create " + where);
  h5::write_attr(dset, "sample_ids", std::vector<int64_t>(sample_ids.begin(), sample_ids.end()));
  return dset;
}

// The local rows [S, local_seq, row_elems] in global-position order: local
// itself when already sorted, else a copy in `sorted`. Rows sorted by position
// make the memory order match the file order of the selection (HDF5 pairs
// elements in row-major order of each).
const float* rows_by_position(const float* local, int64_t S, int64_t row_elems,
                              const std::vector<int64_t>& positions,
                              const std::vector<size_t>& order, std::vector<float>& sorted) {
  if (std::is_sorted(positions.begin(), positions.end())) return local;
  const int64_t local_seq = static_cast<int64_t>(positions.size());
  sorted.resize(static_cast<size_t>(S * local_seq * row_elems));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < local_seq; ++i)
      std::memcpy(
          &sorted[static_cast<size_t>((s * local_seq + i) * row_elems)],
          local + (s * local_seq + static_cast<int64_t>(order[static_cast<size_t>(i)])) * row_elems,
          static_cast<size_t>(row_elems) * sizeof(float));
  return sorted.data();
}

// Selects in the file one block [S, run, rest...] per run of consecutive positions.
void select_position_runs(hid_t fsel, const std::vector<hsize_t>& dims,
                          const std::vector<int64_t>& positions, const std::vector<size_t>& order,
                          const std::string& where) {
  TRIDENT_H5(H5Sselect_none(fsel), "select none");
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    while (j < order.size() && positions[order[j]] == positions[order[j - 1]] + 1) ++j;
    std::vector<hsize_t> start(dims.size(), 0), count = dims;
    start[1] = static_cast<hsize_t>(positions[order[i]]);
    count[1] = static_cast<hsize_t>(j - i);
    TRIDENT_H5(
        H5Sselect_hyperslab(fsel, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr),
        "select positions of " + where);
    i = j;
  }
}

}  // namespace

void RunFile::write_activation(int step, int layer, const std::string& name,
                               const std::vector<int64_t>& global_shape,
                               const std::vector<int>& sample_ids, const float* local,
                               const std::vector<int64_t>& global_positions) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": write_activation after close");
  h5::QuietErrors quiet;
  const std::string where =
      "/activations/step_" + std::to_string(step) + "/layer_" + std::to_string(layer) + "/" + name;

  // Every rank must create the same dataset: compare what defines it.
  std::vector<int64_t> key = {step, layer, name_key(name),
                              static_cast<int64_t>(global_shape.size())};
  key.insert(key.end(), global_shape.begin(), global_shape.end());
  key.insert(key.end(), sample_ids.begin(), sample_ids.end());
  agree_or_throw(same_on_all_ranks(key, world_),
                 where + ": ranks passed different names, shapes or sample_ids", world_);

  std::vector<size_t> order(global_positions.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return global_positions[a] < global_positions[b]; });
  const std::string problem =
      activation_problem(global_shape, sample_ids, local, global_positions, order, name);
  agree_or_throw(problem.empty(), where + ": " + problem, world_);

  Handle steps_group = h5::open_or_create_group(file_, "activations/step_" + std::to_string(step));
  Handle layer_group = h5::open_or_create_group(steps_group, "layer_" + std::to_string(layer));
  htri_t exists = TRIDENT_H5(H5Lexists(layer_group, name.c_str(), H5P_DEFAULT), "look up " + where);
  agree_or_throw(exists == 0, where + " was already written", world_);

  const std::vector<hsize_t> dims(global_shape.begin(), global_shape.end());
  Handle dset = create_activation(layer_group, name, where, dims, sample_ids);
  int64_t row_elems = 1;
  for (size_t d = 2; d < global_shape.size(); ++d) row_elems *= global_shape[d];
  std::vector<float> sorted;
  const float* src =
      rows_by_position(local, global_shape[0], row_elems, global_positions, order, sorted);

  Handle fsel = TRIDENT_H5_SPACE(H5Dget_space(dset), "dataset space");
  select_position_runs(fsel, dims, global_positions, order, where);
  const int64_t local_seq = static_cast<int64_t>(global_positions.size());
  std::vector<hsize_t> mdims = dims;
  mdims[1] = static_cast<hsize_t>(std::max<int64_t>(local_seq, 1));
  Handle mem = simple_space(mdims);
  if (local_seq == 0) TRIDENT_H5(H5Sselect_none(mem), "select none");
  Handle xfer = collective_xfer();
  TRIDENT_H5(H5Dwrite(dset, H5T_NATIVE_FLOAT, mem, fsel, xfer, local_seq ? src : nullptr),
             "write " + where);
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

void RunFile::append_event(const RunEvent& e) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": append_event after close");
  h5::QuietErrors quiet;
  const bool ok = !e.kind.empty() && e.kind.size() < kKindBytes;
  agree_or_throw(ok, "event kind '" + e.kind + "' must have 1 to 15 characters", world_);
  RunEventRow row{};
  row.step = e.step;
  copy_cstr(row.kind, sizeof row.kind, e.kind);
  row.rank = e.rank;
  row.value = e.value;
  row.reference = e.reference;
  copy_cstr(row.detail, sizeof row.detail, e.detail);
  Handle mtype = run_event_type();
  append_row(file_, rank_, "events", run_events_, mtype, &row);
  run_events_ += 1;
  flush();
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

void RunFile::append_eval(const EvalMetrics& m) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": append_eval after close");
  h5::QuietErrors quiet;
  Handle mtype = eval_type();
  append_row(file_, rank_, "metrics/eval", evals_, mtype, &m);
  evals_ += 1;
  flush();
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

void RunFile::append_checkpoint(const CheckpointRecord& r) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": append_checkpoint after close");
  h5::QuietErrors quiet;
  Handle mtype = checkpoint_type();
  append_row(file_, rank_, "metrics/checkpoints", checkpoints_, mtype, &r);
  checkpoints_ += 1;
  flush();
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

void RunFile::write_length_histogram(const std::string& name, const std::vector<int64_t>& counts,
                                     const std::string& description) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": write_length_histogram after close");
  h5::QuietErrors quiet;
  // The dataset's shape must be the same on every rank: rank 0's.
  int64_t n = static_cast<int64_t>(counts.size());
  world_.broadcast(&n, sizeof n, 0);
  Handle data = h5::open_or_create_group(file_, "data");
  Handle space = simple_space({static_cast<hsize_t>(n)});
  Handle ds = TRIDENT_H5_DSET(
      H5Dcreate2(data, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
      "create /data/" + name);
  if (n > 0) {
    const hsize_t mine = rank_ == 0 ? static_cast<hsize_t>(n) : 0;
    Handle fsel = select_rows(ds, 0, mine);
    Handle mem = memory_rows(ds, mine);
    Handle xfer = collective_xfer();
    TRIDENT_H5(H5Dwrite(ds, H5T_NATIVE_INT64, mem, fsel, xfer, counts.data()),
               "write /data/" + name);
  }
  h5::write_attr(ds, "bins", "bin b counts lengths in [2^b, 2^(b+1)) tokens");
  h5::write_attr(ds, "description", description);
  flush();
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

void RunFile::write_rank_summaries(const RankSummary& mine) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": write_rank_summaries after close");
  h5::QuietErrors quiet;
  Handle ranks = h5::open_or_create_group(file_, "ranks");
  Handle mtype = summary_type();
  htri_t exists = TRIDENT_H5(H5Lexists(ranks, "summary", H5P_DEFAULT), "look up /ranks/summary");
  Handle dset;
  if (exists > 0) {
    dset = open_dataset(ranks, "summary");
  } else {
    Handle ftype = packed(mtype);
    Handle space = simple_space({static_cast<hsize_t>(size_)});
    dset = TRIDENT_H5_DSET(
        H5Dcreate2(ranks, "summary", ftype, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
        "create /ranks/summary");
    h5::write_attr(dset, "comm_wait_columns", kCommColumns);
  }
  RankSummary row = mine;
  row.rank = rank_;
  Handle fsel = select_rows(dset, static_cast<hsize_t>(rank_), 1);
  Handle mem = memory_rows(dset, 1);
  Handle xfer = collective_xfer();
  TRIDENT_H5(H5Dwrite(dset, mtype, mem, fsel, xfer, &row), "write /ranks/summary");
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

void RunFile::append_rank_steps(const std::vector<RankStepRow>& rows) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": append_rank_steps after close");
  h5::QuietErrors quiet;
  const bool ok = rank_ != 0 || static_cast<int>(rows.size()) == size_;
  agree_or_throw(ok, "/ranks/steps: rank 0 must pass one row per rank", world_);
  Handle ranks = h5::open_or_create_group(file_, "ranks");
  Handle mtype = rank_step_type();
  if (rank_steps_ == 0) {
    Handle ftype = packed(mtype);
    Handle ds = create_extendible(ranks, "steps", ftype, {}, kStepChunk);
    h5::write_attr(ds, "compute_columns",
                   std::vector<std::string>{"forward", "backward", "weight", "optimizer", "data",
                                            "checkpoint"});
    h5::write_attr(ds, "wait_columns", kCommColumns);
  }
  Handle ds = open_dataset(ranks, "steps");
  const hsize_t first = static_cast<hsize_t>(rank_steps_);
  extend_rows(ds, first + static_cast<hsize_t>(size_));
  if (rank_ == 0) {
    Handle fsel = select_rows(ds, first, static_cast<hsize_t>(size_));
    Handle mem = memory_rows(ds, static_cast<hsize_t>(size_));
    TRIDENT_H5(H5Dwrite(ds, mtype, mem, fsel, H5P_DEFAULT, rows.data()), "write /ranks/steps");
  }
  rank_steps_ += size_;  // flushed with the step's rows by the caller
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

template <class T>
void RunFile::write_root_attr(const std::string& name, T value) try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": set_root_attr after close");
  h5::QuietErrors quiet;
  if constexpr (std::is_same_v<T, std::string>)
    value = bcast_from(0, value, world_);
  else
    world_.broadcast(&value, sizeof value, 0);
  agree_or_throw(same_on_all_ranks({name_key(name)}, world_),
                 "set_root_attr: ranks passed different names", world_);
  h5::write_attr(file_, name, value);
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

void RunFile::set_root_attr(const std::string& name, const std::string& value) {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  write_root_attr(name, value);
}
void RunFile::set_root_attr(const std::string& name, double value) { write_root_attr(name, value); }
void RunFile::set_root_attr(const std::string& name, int64_t value) {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  write_root_attr(name, value);
}

void RunFile::flush() try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  TRIDENT_CHECK(!closed_, "run file " + path_ + ": flush after close");
  h5::QuietErrors quiet;
  TRIDENT_H5(H5Fflush(file_, H5F_SCOPE_GLOBAL), "flush it");
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

void RunFile::close() try {
  h5::Lock lock(h5::library_mutex());
  BlockingCall blocking("a collective write of output file " + path_, world_.timeout_s());
  if (closed_) return;
  h5::QuietErrors quiet;
  h5::write_attr(file_, "completed", int64_t{1});
  TRIDENT_H5(H5Fflush(file_, H5F_SCOPE_GLOBAL), "flush it");
  herr_t rc = H5Fclose(file_);
  file_ = -1;
  closed_ = true;
  if (rc < 0) h5::fail(__FILE__, __LINE__, "close it");
} catch (const h5::Failure& failure) {
  throw_write_failure(path_, failure);
}

std::string resolve_output_name(const std::string& pattern, Communicator& world) {
  const int rank = world.rank();
  std::string id;
  if (rank == 0) {
    const char* job = std::getenv("SLURM_JOB_ID");
    if (job && *job) {
      id = job;
    } else {
      std::time_t t = std::time(nullptr);
      std::tm tm{};
      gmtime_r(&t, &tm);
      char buf[32];
      std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
      id = std::string("local-") + buf;
    }
  }
  id = bcast_from(0, id, world.host());
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'j') {
      out += id;
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

}  // namespace trident
