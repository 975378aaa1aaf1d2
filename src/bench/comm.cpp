// `trident bench comm` (see trident/bench/comm.hpp): the cases, their data
// and checks, and the sweep. Each rank's data is derived from its rank and
// index so the exact result is known: integers below 2^24, exact in every
// element type and in any summation order.
#include "trident/bench/comm.hpp"

#include <algorithm>
#include <array>
#include <cstdio>

#include "trident/bench/engine.hpp"
#include "trident/comm/comm.hpp"
#include "trident/core/clock.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::bench {
namespace {

// What a case moves, and so how its buffers are laid out and checked.
enum class Kind { allreduce, reduce_scatter, allgather, alltoall, sendrecv };

struct CommCase {
  std::string name;  // the table's: comm_NAME[_GROUP]
  Kind kind;
  ElemType type = ElemType::f32;
  ReduceOp op = ReduceOp::sum;
  SumOrder order = SumOrder::any;
  std::string elements = "float32";  // the title's "int32 max"
};

// ---- the cases' arithmetic ---------------------------------------------------

const char* what_size(Kind k) {
  switch (k) {
    case Kind::allreduce:
      return "bytes reduced per rank";
    case Kind::reduce_scatter:
      return "bytes reduced (all blocks)";
    case Kind::allgather:
      return "bytes gathered (all ranks)";
    case Kind::alltoall:
      return "bytes sent per rank";
    case Kind::sendrecv:
      break;
  }
  return "bytes sent per rank (ring)";
}

double bus_factor(Kind k, int p) {
  if (k == Kind::allreduce) return 2.0 * (p - 1) / p;
  if (k == Kind::sendrecv) return 1.0;
  return double(p - 1) / p;
}

// A size counts n elements per rank (per peer, per block) times this.
size_t blocks(Kind k, int p) { return k == Kind::allreduce || k == Kind::sendrecv ? 1 : size_t(p); }
size_t send_elems(Kind k, size_t n, int p) {
  return k == Kind::allgather || k == Kind::sendrecv || k == Kind::allreduce ? n : n * size_t(p);
}
size_t recv_elems(Kind k, size_t n, int p) {
  return k == Kind::allgather || k == Kind::alltoall ? n * size_t(p) : n;
}

double own_value(int rank, size_t i) {
  return double((int64_t(rank) * 4096 + int64_t(i % 4096)) % (1 << 24));
}
double pair_value(int src, int dst, int p, size_t j) {
  return double(((int64_t(src) * p + dst) * 1024 + int64_t(j % 1024)) % (1 << 24));
}
double sum_value(int rank, size_t i) {
  return double(1 + (int64_t(rank) * 131 + int64_t(i) * 7) % 1021);
}

// Element i of the reduction over the group of sum_value(r, i).
double reduced_value(ReduceOp op, int p, size_t i) {
  double v = sum_value(0, i);
  for (int r = 1; r < p; ++r) {
    const double x = sum_value(r, i);
    v = op == ReduceOp::sum ? v + x : op == ReduceOp::max ? std::max(v, x) : std::min(v, x);
  }
  return v;
}

// Element i of rank `me`'s send buffer.
double input(Kind k, int me, int p, size_t n, size_t i) {
  switch (k) {
    case Kind::allreduce:
    case Kind::reduce_scatter:
      return sum_value(me, i);
    case Kind::alltoall:
      return pair_value(me, int(i / n), p, i % n);
    default:
      return own_value(me, i);
  }
}

// Element i of rank `me`'s result.
double expected(const CommCase& c, int me, int p, size_t n, size_t i) {
  switch (c.kind) {
    case Kind::allreduce:
      return reduced_value(c.op, p, i);
    case Kind::reduce_scatter:
      return reduced_value(ReduceOp::sum, p, size_t(me) * n + i);
    case Kind::allgather:
      return own_value(int(i / n), i % n);
    case Kind::alltoall:
      return pair_value(int(i / n), me, p, i % n);
    case Kind::sendrecv:
      break;
  }
  return own_value((me + p - 1) % p, i);
}

// ---- buffers on the run's device -------------------------------------------

DType dtype_of(ElemType t) {
  switch (t) {
    case ElemType::f64:
      return DType::f64;
    case ElemType::i32:
      return DType::i32;
    case ElemType::i64:
      return DType::i64;
    case ElemType::f32:
      break;
  }
  return DType::f32;
}

// f(T{}) for the C++ type of an element type.
template <typename F>
auto with_type(ElemType type, F f) {
  switch (type) {
    case ElemType::f64:
      return f(double{});
    case ElemType::i32:
      return f(int32_t{});
    case ElemType::i64:
      return f(int64_t{});
    case ElemType::f32:
      break;
  }
  return f(float{});
}

// m elements value(i) uploaded to ctx's device.
template <typename V>
Tensor device_values(const kernels::Ctx& ctx, ElemType type, size_t m, V value) {
  return with_type(type, [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> host(m);
    for (size_t i = 0; i < m; ++i) host[i] = T(value(i));
    return kernels::from_host(ctx, host.data(), {int64_t(m)}, dtype_of(type));
  });
}

// Elements of buf (any device) that differ from want(i).
template <typename W>
long long count_wrong(const kernels::Ctx& ctx, const Tensor& buf, ElemType type, W want) {
  const Tensor host = kernels::to_host(ctx, buf);
  return with_type(type, [&](auto zero) {
    using T = decltype(zero);
    const T* x = static_cast<const T*>(host.data_ptr());
    long long bad = 0;
    for (size_t i = 0; i < size_t(host.numel()); ++i) bad += double(x[i]) != want(i);
    return bad;
  });
}

struct Buffers {
  Tensor send, recv;
  std::vector<int64_t> counts, displs;  // all-to-all-v, per peer
};

// One operation; in_place: the all-reduce on the send buffer itself (out of
// place: the input copied to the output buffer, then reduced there, since the
// Communicator's all-reduce is in place).
void run_once(const CommCase& c, Communicator& g, const kernels::Ctx& ctx, Buffers& b, size_t n,
              bool in_place) {
  const size_t bytes = n * elem_size(c.type);
  switch (c.kind) {
    case Kind::allreduce:
      if (!in_place) kernels::copy(ctx, b.recv, b.send);
      g.allreduce(in_place ? b.send.data_ptr() : b.recv.data_ptr(), n, c.type, c.op, c.order);
      return;
    case Kind::reduce_scatter:
      g.reduce_scatter_sum(b.send.data<float>(), b.recv.data<float>(), n, c.order);
      return;
    case Kind::allgather:
      g.allgather(b.send.data_ptr(), b.recv.data_ptr(), bytes);
      return;
    case Kind::alltoall:
      g.alltoallv(b.send.data_ptr(), b.counts, b.displs, b.recv.data_ptr(), b.counts, b.displs,
                  elem_size(c.type));
      return;
    case Kind::sendrecv:
      break;
  }
  const int p = g.size(), me = g.rank();
  std::vector<Request> reqs;
  reqs.push_back(g.irecv(b.recv.data_ptr(), bytes, (me + p - 1) % p, 11));
  reqs.push_back(g.isend(b.send.data_ptr(), bytes, (me + 1) % p, 11));
  g.wait_all(reqs);
}

// Fresh inputs for n elements per rank (and block).
Buffers prepare(const CommCase& c, const Communicator& g, const kernels::Ctx& ctx, size_t n) {
  const int p = g.size(), me = g.rank();
  Buffers b;
  b.send = device_values(ctx, c.type, send_elems(c.kind, n, p),
                         [&](size_t i) { return input(c.kind, me, p, n, i); });
  b.recv = device_values(ctx, c.type, recv_elems(c.kind, n, p), [](size_t) { return -1.0; });
  b.counts.assign(size_t(p), int64_t(n));
  for (int d = 0; d < p; ++d) b.displs.push_back(int64_t(d) * int64_t(n));
  return b;
}

// ---- the sweep -------------------------------------------------------------

struct Timing {
  double time_s = 0;
  long long wrong = 0;  // over all ranks
};

// One placement of one size: the check on fresh inputs, then warm-up and the
// timed loop on the same buffers (slowest rank, mean over iterations).
Timing measure_placement(const CommCase& c, Communicator& g, Communicator& world,
                         const kernels::Ctx& ctx, size_t n, bool in_place,
                         const CommBenchOptions& o) {
  Buffers b = prepare(c, g, ctx, n);
  run_once(c, g, ctx, b, n, in_place);
  const bool own = in_place && c.kind == Kind::allreduce;
  Timing t;
  t.wrong = count_wrong(ctx, own ? b.send : b.recv, c.type,
                        [&](size_t i) { return expected(c, g.rank(), g.size(), n, i); });
  int64_t wrong = t.wrong;
  world.allreduce_sum(&wrong, 1);
  t.wrong = wrong;
  for (int i = 0; i < o.warmup; ++i) run_once(c, g, ctx, b, n, in_place);
  world.barrier();
  const double t0 = device_now_s(ctx);
  for (int i = 0; i < o.iters; ++i) run_once(c, g, ctx, b, n, in_place);
  t.time_s = (device_now_s(ctx) - t0) / o.iters;
  world.allreduce_max(&t.time_s, 1);
  return t;
}

bool has_in_place(const CommCase& c) { return c.kind == Kind::allreduce; }

// The empty table of one case.
BenchTable table_of(const CommCase& c, int p, int world_size, const CommBenchOptions& o) {
  BenchTable t;
  t.name = "comm_" + c.name + (o.group == "world" ? "" : "_" + o.group);
  t.title = c.name + " on " + o.group + ": " + std::to_string(world_size / p) + " group(s) of " +
            std::to_string(p) + " ranks at once, " + c.elements + ", " + std::to_string(o.iters) +
            " iterations";
  t.columns = {"size_B", "count", "type", "time_us", "algbw_GB/s", "busbw_GB/s", "#wrong"};
  char factor[32];
  std::snprintf(factor, sizeof factor, "%.4g", bus_factor(c.kind, p));
  t.notes.push_back(std::string("size: ") + what_size(c.kind) + "; busbw = algbw x " + factor +
                    " for " + std::to_string(p) +
                    " ranks; time: slowest rank, mean over iterations");
  if (has_in_place(c)) {
    for (const char* col :
         {"in_place_time_us", "in_place_algbw_GB/s", "in_place_busbw_GB/s", "in_place_#wrong"})
      t.columns.push_back(col);
    t.notes.push_back(
        "time_us..#wrong: out of place (the input copied to the output buffer, then the "
        "all-reduce in place there: the Communicator's all-reduce is in place; the copy is "
        "timed); in_place_*: on the input buffer itself");
  }
  return t;
}

// One size of one case: a row of t. Returns the wrong elements (all ranks).
long long measure_size(const CommCase& c, size_t bytes, Communicator& g, BenchJob& job,
                       const CommBenchOptions& o, BenchTable& t) {
  const int p = g.size();
  const size_t n = bytes / elem_size(c.type) / blocks(c.kind, p);
  if (n == 0) return 0;
  // What is actually moved after rounding down to whole elements per rank.
  const size_t elems = n * blocks(c.kind, p), moved = elems * elem_size(c.type);
  std::vector<BenchCell> row = {static_cast<long long>(moved), static_cast<long long>(elems),
                                std::string(elem_name(c.type))};
  long long wrong = 0;
  for (bool in_place : {false, true}) {
    if (in_place && !has_in_place(c)) break;
    const Timing m = measure_placement(c, g, job.world(), job.ctx(), n, in_place, o);
    const double algbw = double(moved) / m.time_s / 1e9;
    row.insert(row.end(), {m.time_s * 1e6, algbw, algbw * bus_factor(c.kind, p), m.wrong});
    wrong += m.wrong;
  }
  t.add_row(std::move(row));
  return wrong;
}

// ---- the table of cases from the flags -------------------------------------

constexpr std::array<std::pair<const char*, ElemType>, 4> kDtypes = {{{"float", ElemType::f32},
                                                                      {"double", ElemType::f64},
                                                                      {"int32", ElemType::i32},
                                                                      {"int64", ElemType::i64}}};
constexpr std::array<std::pair<const char*, ReduceOp>, 3> kReductions = {
    {{"sum", ReduceOp::sum}, {"max", ReduceOp::max}, {"min", ReduceOp::min}}};

template <typename Table>
auto lookup(const Table& table, const std::string& name, const std::string& flag,
            const std::string& value, const char* what, const char* names) {
  auto it = std::find_if(table.begin(), table.end(), [&](auto& x) { return name == x.first; });
  if (it == table.end())
    throw InputError(flag + " " + value + ": unknown " + what + " '" + name + "' (" + names + ")");
  return *it;
}

// "allreduce" of the flags: float sum (the plain all-reduce) and every other
// --dtypes x --reduce-ops pair, in that order.
void add_allreduces(std::vector<CommCase>& out, const CommBenchOptions& o) {
  std::vector<CommCase> typed;
  bool float_sum = false;
  for (const std::string& d : split_list(o.dtypes)) {
    const auto dt = lookup(kDtypes, d, "--dtypes", o.dtypes, "type", "float, double, int32, int64");
    for (const std::string& r : split_list(o.reduce_ops)) {
      const auto ro =
          lookup(kReductions, r, "--reduce-ops", o.reduce_ops, "reduction", "sum, max, min");
      if (dt.second == ElemType::f32 && ro.second == ReduceOp::sum) {
        float_sum = true;
        continue;
      }
      typed.push_back({std::string("allreduce_") + dt.first + "_" + ro.first, Kind::allreduce,
                       dt.second, ro.second, SumOrder::any,
                       std::string(dt.first) + " " + ro.first});
    }
  }
  if (float_sum) out.push_back({"allreduce", Kind::allreduce});
  out.insert(out.end(), typed.begin(), typed.end());
}

std::vector<CommCase> comm_cases(const CommBenchOptions& o) {
  std::vector<CommCase> out;
  for (const std::string& name : split_list(o.ops)) {
    if (name == "allreduce") {
      add_allreduces(out, o);
    } else if (name == "allreduce_ordered") {
      out.push_back({name, Kind::allreduce, ElemType::f32, ReduceOp::sum, SumOrder::rank});
    } else if (name == "reduce_scatter_ordered") {
      out.push_back({name, Kind::reduce_scatter, ElemType::f32, ReduceOp::sum, SumOrder::rank});
    } else if (name == "allgather" || name == "alltoall" || name == "sendrecv") {
      out.push_back({name, name == "allgather"  ? Kind::allgather
                           : name == "alltoall" ? Kind::alltoall
                                                : Kind::sendrecv});
    } else {
      throw InputError("--ops " + o.ops + ": unknown operation '" + name +
                       "' (allreduce, allgather, alltoall, sendrecv, allreduce_ordered, "
                       "reduce_scatter_ordered)");
    }
  }
  if (out.empty()) throw InputError("--ops: name at least one operation");
  return out;
}

void check_options(const CommBenchOptions& o, size_t lo, size_t hi) {
  if (lo > hi)
    throw InputError("--min-bytes " + o.min_bytes + " is larger than --max-bytes " + o.max_bytes);
  if (o.iters < 1) throw InputError("--iters " + std::to_string(o.iters) + ": must be >= 1");
  if (o.warmup < 0) throw InputError("--warmup " + std::to_string(o.warmup) + ": must be >= 0");
  static const char* kGroups[] = {"world", "cp", "pp", "dp", "dpcp", "ep"};
  if (std::find(std::begin(kGroups), std::end(kGroups), o.group) == std::end(kGroups))
    throw InputError("--group " + o.group + ": must be one of world, cp, pp, dp, dpcp, ep");
}

}  // namespace

int run_comm_bench(const Config& cfg, const CommBenchOptions& o) {
  const size_t lo = parse_size("--min-bytes", o.min_bytes);
  const size_t hi = parse_size("--max-bytes", o.max_bytes);
  check_options(o, lo, hi);
  const std::vector<CommCase> cases = comm_cases(o);
  BenchJob job = open_job(cfg);
  Communicator& group = mesh_group(job, o.group);
  const int rank = job.world().rank();
  std::vector<BenchTable> tables;
  Verdict verdict("wrong elements in total");
  for (const CommCase& c : cases) {
    BenchTable t = table_of(c, group.size(), job.world().size(), o);
    for (size_t bytes = lo; bytes <= hi; bytes *= 2)
      verdict.add(measure_size(c, bytes, group, job, o, t));
    print_table(t, rank);
    tables.push_back(std::move(t));
  }
  verdict.print(rank);
  write_report(o.output, tables, rank, o.command_line);
  job.world().barrier();
  verdict.print_error(rank, "bench comm", "elements differ from the expected result");
  return verdict.exit_code();
}

}  // namespace trident::bench
