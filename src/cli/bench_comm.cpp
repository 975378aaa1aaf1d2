// `trident bench comm`: bandwidth of allreduce, allgather, alltoall(v) and a
// send/recv ring through trident::Communicator (and, asked for, the
// rank-ordered all-reduce and reduce-scatter of the gradient sums, and the
// all-reduce over element types and reductions as nccl-tests' -d / -o),
// over doubling sizes, as an nccl-tests-style table. Each rank's data is
// derived from its rank so the exact result is known; mismatches are counted
// in #wrong and make the exit code 1, so CI can use the benchmark as a check
// too. With a config and --group, every group of that kind (e.g. all EP
// groups) runs at once.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>

#include "commands.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/check_config.hpp"

namespace trident::cli {
namespace {

// Values exact in fp32 (integers below 2^24), distinct per rank and index.
float own_value(int rank, size_t i) {
  return float((int64_t(rank) * 4096 + int64_t(i % 4096)) % (1 << 24));
}
float pair_value(int src, int dst, int p, size_t j) {
  return float(((int64_t(src) * p + dst) * 1024 + int64_t(j % 1024)) % (1 << 24));
}
float sum_value(int rank, size_t i) {
  return float(1 + (int64_t(rank) * 131 + int64_t(i) * 7) % 1021);
}

// One collective under test: fill inputs for a size, run it once, count the
// elements that differ from the known result. busbw is algbw times factor(p).
struct CommOp {
  std::string name;  // also the table's: comm_NAME
  const char* what;  // what "size" measures
  std::function<double(int p)> bus_factor;
  // Elements of float per rank (or per peer) for a size in bytes (0: too small),
  // and how many of those make up the size (1, or p for gather/all-to-all).
  std::function<size_t(size_t bytes, int p)> count;
  std::function<size_t(int p)> scale;
  std::function<void(Communicator&, size_t n)> prepare;
  std::function<void(Communicator&, size_t n)> run;
  std::function<int64_t(Communicator&, size_t n)> wrong;
  ElemType type = ElemType::f32;  // the elements moved
  std::string elements = {};      // a typed all-reduce's "int32 max"; empty: float32
};

struct Buffers {
  std::vector<float> a, b;
  std::vector<unsigned char> raw;  // a typed all-reduce's elements
  std::vector<Request> reqs;
  std::vector<int64_t> sc, sd, rc, rd;
};

// Elements of got[0:n] that differ from the float sum in rank order of
// sum_value(r, first + i) over the group's ranks.
int64_t wrong_sums(const Communicator& c, const float* got, size_t n, size_t first) {
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    float ref = 0;
    for (int r = 0; r < c.size(); ++r) ref += sum_value(r, first + i);
    bad += got[i] != ref;
  }
  return bad;
}

// The all-reduce as MPI (or NCCL) brackets it, or with `order` rank as the
// trainer's gradient sums ask for it (comm.hpp's SumOrder): the check is the
// same, the float sum in rank order, exact either way for these values.
CommOp allreduce_op(Buffers& buf, SumOrder order) {
  return {order == SumOrder::rank ? "allreduce_ordered" : "allreduce",
          "bytes reduced per rank",
          [](int p) { return 2.0 * (p - 1) / p; },
          [](size_t bytes, int) { return bytes / sizeof(float); },
          [](int) { return size_t(1); },
          [&buf](Communicator& c, size_t n) {
            buf.a.resize(n);
            for (size_t i = 0; i < n; ++i) buf.a[i] = sum_value(c.rank(), i);
          },
          [&buf, order](Communicator& c, size_t n) { c.allreduce_sum(buf.a.data(), n, order); },
          [&buf](Communicator& c, size_t n) { return wrong_sums(c, buf.a.data(), n, 0); }};
}

// The sharded optimizer's gradient reduce-scatter (rank-ordered sums): each
// rank receives its block of the sum of the p ranks' p blocks.
CommOp reduce_scatter_ordered_op(Buffers& buf) {
  return {"reduce_scatter_ordered",
          "bytes reduced (all blocks)",
          [](int p) { return double(p - 1) / p; },
          [](size_t bytes, int p) { return bytes / sizeof(float) / size_t(p); },
          [](int p) { return size_t(p); },
          [&buf](Communicator& c, size_t n) {
            const size_t all = n * size_t(c.size());
            buf.a.resize(all);
            buf.b.assign(n, -1.0f);
            for (size_t i = 0; i < all; ++i) buf.a[i] = sum_value(c.rank(), i);
          },
          [&buf](Communicator& c, size_t n) {
            c.reduce_scatter_sum(buf.a.data(), buf.b.data(), n, SumOrder::rank);
          },
          [&buf](Communicator& c, size_t n) {
            return wrong_sums(c, buf.b.data(), n, size_t(c.rank()) * n);
          }};
}

// nccl-tests' names of the element types (-d) and reductions (-o) that the
// typed all-reduce sweeps: --dtypes and --reduce-ops.
constexpr std::array<std::pair<const char*, ElemType>, 4> kDtypes = {{{"float", ElemType::f32},
                                                                      {"double", ElemType::f64},
                                                                      {"int32", ElemType::i32},
                                                                      {"int64", ElemType::i64}}};
constexpr std::array<std::pair<const char*, ReduceOp>, 3> kReductions = {
    {{"sum", ReduceOp::sum}, {"max", ReduceOp::max}, {"min", ReduceOp::min}}};

template <typename T>
T* typed(Buffers& buf) {
  return reinterpret_cast<T*>(buf.raw.data());
}

// The expected element i of a reduction over the group of sum_value(r, i):
// integers below 2^24 in every type, so exact whatever the order.
double reduced_value(ReduceOp op, int p, size_t i) {
  double v = sum_value(0, i);
  for (int r = 1; r < p; ++r) {
    const double x = sum_value(r, i);
    v = op == ReduceOp::sum ? v + x : op == ReduceOp::max ? std::max(v, x) : std::min(v, x);
  }
  return v;
}

// f(T{}) for the C++ type T of an element type: one dispatch for the typed
// all-reduce's fill and check.
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

template <typename T>
void fill_typed(Buffers& buf, int rank, size_t n) {
  buf.raw.resize(n * sizeof(T));
  T* x = typed<T>(buf);
  for (size_t i = 0; i < n; ++i) x[i] = T(sum_value(rank, i));
}

template <typename T>
int64_t wrong_typed(Buffers& buf, ReduceOp op, int p, size_t n) {
  const T* x = typed<T>(buf);
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += double(x[i]) != reduced_value(op, p, i);
  return bad;
}

// The all-reduce of one element type and reduction (in place, the backend's
// order), as nccl-tests sweeps them; float sum is the plain "allreduce".
CommOp typed_allreduce_op(Buffers& buf, const char* dtype, ElemType type, const char* reduction,
                          ReduceOp op) {
  CommOp o = {std::string("allreduce_") + dtype + "_" + reduction,
              "bytes reduced per rank",
              [](int p) { return 2.0 * (p - 1) / p; },
              [type](size_t bytes, int) { return bytes / elem_size(type); },
              [](int) { return size_t(1); },
              [&buf, type](Communicator& c, size_t n) {
                with_type(type, [&](auto zero) { fill_typed<decltype(zero)>(buf, c.rank(), n); });
              },
              [&buf, type, op](Communicator& c, size_t n) {
                c.allreduce(buf.raw.data(), n, type, op, SumOrder::any);
              },
              [&buf, type, op](Communicator& c, size_t n) {
                return with_type(type, [&](auto zero) {
                  return wrong_typed<decltype(zero)>(buf, op, c.size(), n);
                });
              }};
  o.type = type;
  o.elements = std::string(dtype) + " " + reduction;
  return o;
}

CommOp allgather_op(Buffers& buf) {
  return {"allgather",
          "bytes gathered (all ranks)",
          [](int p) { return double(p - 1) / p; },
          [](size_t bytes, int p) { return bytes / sizeof(float) / size_t(p); },
          [](int p) { return size_t(p); },
          [&buf](Communicator& c, size_t n) {
            buf.a.resize(n);
            buf.b.assign(n * size_t(c.size()), -1.0f);
            for (size_t i = 0; i < n; ++i) buf.a[i] = own_value(c.rank(), i);
          },
          [&buf](Communicator& c, size_t n) {
            c.allgather(buf.a.data(), buf.b.data(), n * sizeof(float));
          },
          [&buf](Communicator& c, size_t n) {
            int64_t bad = 0;
            for (int r = 0; r < c.size(); ++r)
              for (size_t i = 0; i < n; ++i) bad += buf.b[r * n + i] != own_value(r, i);
            return bad;
          }};
}

CommOp alltoall_op(Buffers& buf) {
  return {"alltoall",
          "bytes sent per rank",
          [](int p) { return double(p - 1) / p; },
          [](size_t bytes, int p) { return bytes / sizeof(float) / size_t(p); },
          [](int p) { return size_t(p); },
          [&buf](Communicator& c, size_t n) {
            const int p = c.size();
            buf.a.resize(n * p);
            buf.b.assign(n * p, -1.0f);
            buf.sc.assign(p, int64_t(n));
            buf.rc = buf.sc;
            buf.sd.resize(p);
            for (int d = 0; d < p; ++d) buf.sd[d] = int64_t(d) * int64_t(n);
            buf.rd = buf.sd;
            for (int d = 0; d < p; ++d)
              for (size_t j = 0; j < n; ++j) buf.a[d * n + j] = pair_value(c.rank(), d, p, j);
          },
          [&buf](Communicator& c, size_t) {
            c.alltoallv(buf.a.data(), buf.sc, buf.sd, buf.b.data(), buf.rc, buf.rd, sizeof(float));
          },
          [&buf](Communicator& c, size_t n) {
            int64_t bad = 0;
            for (int s = 0; s < c.size(); ++s)
              for (size_t j = 0; j < n; ++j)
                bad += buf.b[s * n + j] != pair_value(s, c.rank(), c.size(), j);
            return bad;
          }};
}

CommOp sendrecv_op(Buffers& buf) {
  return {"sendrecv",
          "bytes sent per rank (ring)",
          [](int) { return 1.0; },
          [](size_t bytes, int) { return bytes / sizeof(float); },
          [](int) { return size_t(1); },
          [&buf](Communicator& c, size_t n) {
            buf.a.resize(n);
            buf.b.assign(n, -1.0f);
            for (size_t i = 0; i < n; ++i) buf.a[i] = own_value(c.rank(), i);
          },
          [&buf](Communicator& c, size_t n) {
            const int p = c.size(), me = c.rank();
            buf.reqs.clear();
            buf.reqs.push_back(c.irecv(buf.b.data(), n * sizeof(float), (me + p - 1) % p, 11));
            buf.reqs.push_back(c.isend(buf.a.data(), n * sizeof(float), (me + 1) % p, 11));
            c.wait_all(buf.reqs);
          },
          [&buf](Communicator& c, size_t n) {
            const int prev = (c.rank() + c.size() - 1) % c.size();
            int64_t bad = 0;
            for (size_t i = 0; i < n; ++i) bad += buf.b[i] != own_value(prev, i);
            return bad;
          }};
}

std::vector<CommOp> make_ops(Buffers& buf) {
  return {allreduce_op(buf, SumOrder::any),
          allgather_op(buf),
          alltoall_op(buf),
          sendrecv_op(buf),
          allreduce_op(buf, SumOrder::rank),
          reduce_scatter_ordered_op(buf)};
}

size_t parse_size(const std::string& flag, const std::string& s) {
  // 8, 64K, 16M, 1G (binary multiples).
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    throw InputError(flag + " " + s + ": must be a byte count such as 8, 64K, 16M or 1G");
  }
  const std::string unit = s.substr(pos);
  unsigned long long mult = 1;
  if (unit == "K" || unit == "k")
    mult = 1ULL << 10;
  else if (unit == "M" || unit == "m")
    mult = 1ULL << 20;
  else if (unit == "G" || unit == "g")
    mult = 1ULL << 30;
  else if (!unit.empty())
    throw InputError(flag + " " + s + ": unknown unit '" + unit + "' (use K, M or G)");
  if (v == 0) throw InputError(flag + " " + s + ": must be > 0");
  return size_t(v * mult);
}

class BenchCommCommand : public Command {
 public:
  explicit BenchCommCommand(CLI::App* app) {
    app->add_option("config", config_path_,
                    "Config file (TOML) whose mesh defines --group; none: world only");
    app->add_option("--set", sets_, "Override a config key: section.key=value (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--group", group_,
                    "Communicator to measure: world, cp, pp, dp, dpcp, ep (all groups at once)");
    app->add_option("--ops", ops_,
                    "Comma-separated: allreduce,allgather,alltoall,sendrecv (default), "
                    "allreduce_ordered,reduce_scatter_ordered (rank-ordered float sums)");
    app->add_option("--dtypes", dtypes_,
                    "allreduce's element types, comma-separated: float (default), double, int32, "
                    "int64");
    app->add_option("--reduce-ops", reduce_ops_,
                    "allreduce's reductions, comma-separated: sum (default), max, min");
    app->add_option("--min-bytes", min_bytes_, "Smallest size (e.g. 8, 64K)");
    app->add_option("--max-bytes", max_bytes_, "Largest size (e.g. 16M)");
    app->add_option("--iters", iters_, "Timed iterations per size");
    app->add_option("--warmup", warmup_, "Untimed iterations per size");
    app->add_option("--output", output_, "Write the tables to this HDF5 file");
  }

  bool needs_mpi() const override { return true; }

  int run() override {
    const size_t lo = parse_size("--min-bytes", min_bytes_);
    const size_t hi = parse_size("--max-bytes", max_bytes_);
    check_options(lo, hi);
    Buffers buf;
    const std::vector<CommOp> all_ops = make_ops(buf);
    const std::vector<CommOp> typed_ops = typed_allreduces(buf);
    const std::vector<const CommOp*> chosen = chosen_ops(all_ops, typed_ops);

    const int world_size = comm_world_size(), rank = comm_world_rank();
    Config cfg = load_config(config_path_, sets_);
    train::check_config(cfg, world_size);
    auto job = world_communicator(cfg.runtime.timeout_s);
    auto comms = build_communicators(*job, cfg, detect_topology(*job, cfg));
    Communicator& world = *comms->world;
    Communicator& group = group_communicator(*comms);

    std::vector<BenchTable> tables;
    int64_t total_wrong = 0;
    for (const CommOp* op : chosen) {
      BenchTable t = table_of(*op, group.size(), world_size);
      for (size_t bytes = lo; bytes <= hi; bytes *= 2)
        total_wrong += measure(*op, bytes, group, world, t);
      if (rank == 0) {
        std::fputs(t.format().c_str(), stdout);
        std::fputs("\n", stdout);
        std::fflush(stdout);
      }
      tables.push_back(std::move(t));
    }
    if (rank == 0) {
      std::printf("# wrong elements in total: %lld (%s)\n", static_cast<long long>(total_wrong),
                  total_wrong ? "FAILED" : "OK");
      std::fflush(stdout);
      if (!output_.empty()) write_bench_file(output_, tables, command_line());
    }
    world.barrier();
    if (total_wrong && rank == 0)
      std::fprintf(stderr,
                   "trident: error: bench comm: %lld elements differ from the expected result\n",
                   static_cast<long long>(total_wrong));
    return total_wrong ? 1 : 0;
  }

 private:
  void check_options(size_t lo, size_t hi) const {
    if (lo > hi)
      throw InputError("--min-bytes " + min_bytes_ + " is larger than --max-bytes " + max_bytes_);
    if (iters_ < 1) throw InputError("--iters " + std::to_string(iters_) + ": must be >= 1");
    if (warmup_ < 0) throw InputError("--warmup " + std::to_string(warmup_) + ": must be >= 0");
    static const char* kGroups[] = {"world", "cp", "pp", "dp", "dpcp", "ep"};
    if (std::find(std::begin(kGroups), std::end(kGroups), group_) == std::end(kGroups))
      throw InputError("--group " + group_ + ": must be one of world, cp, pp, dp, dpcp, ep");
  }

  // The items of a comma-separated flag value.
  static std::vector<std::string> items(const std::string& list) {
    std::vector<std::string> out;
    std::stringstream ss(list);
    std::string item;
    while (std::getline(ss, item, ',')) out.push_back(item);
    return out;
  }

  // The all-reduces of --dtypes x --reduce-ops other than float sum (the
  // plain "allreduce"), in that order.
  std::vector<CommOp> typed_allreduces(Buffers& buf) const {
    std::vector<CommOp> out;
    for (const std::string& d : items(dtypes_)) {
      auto dt = std::find_if(kDtypes.begin(), kDtypes.end(), [&](auto& x) { return d == x.first; });
      if (dt == kDtypes.end())
        throw InputError("--dtypes " + dtypes_ + ": unknown type '" + d +
                         "' (float, double, int32, int64)");
      for (const std::string& r : items(reduce_ops_)) {
        auto ro = std::find_if(kReductions.begin(), kReductions.end(),
                               [&](auto& x) { return r == x.first; });
        if (ro == kReductions.end())
          throw InputError("--reduce-ops " + reduce_ops_ + ": unknown reduction '" + r +
                           "' (sum, max, min)");
        if (dt->second != ElemType::f32 || ro->second != ReduceOp::sum)
          out.push_back(typed_allreduce_op(buf, dt->first, dt->second, ro->first, ro->second));
      }
    }
    return out;
  }

  // The operations --ops names, in its order; "allreduce" stands for each
  // --dtypes x --reduce-ops pair.
  std::vector<const CommOp*> chosen_ops(const std::vector<CommOp>& all_ops,
                                        const std::vector<CommOp>& typed_ops) const {
    std::vector<const CommOp*> chosen;
    // typed_ops leaves float sum out: it is the plain "allreduce" op.
    const bool float_sum = std::ranges::count(items(dtypes_), "float") &&
                           std::ranges::count(items(reduce_ops_), "sum");
    for (const std::string& name : items(ops_)) {
      auto it = std::find_if(all_ops.begin(), all_ops.end(),
                             [&](const CommOp& o) { return name == o.name; });
      if (it == all_ops.end())
        throw InputError("--ops " + ops_ + ": unknown operation '" + name +
                         "' (allreduce, allgather, alltoall, sendrecv, allreduce_ordered, "
                         "reduce_scatter_ordered)");
      if (name != "allreduce") {
        chosen.push_back(&*it);
        continue;
      }
      if (float_sum) chosen.push_back(&*it);
      for (const CommOp& t : typed_ops) chosen.push_back(&t);
    }
    if (chosen.empty()) throw InputError("--ops: name at least one operation");
    return chosen;
  }

  Communicator& group_communicator(Communicators& comms) const {
    return *(group_ == "world"  ? comms.world.get()
             : group_ == "cp"   ? comms.cp.get()
             : group_ == "pp"   ? comms.pp.get()
             : group_ == "dp"   ? comms.dp.get()
             : group_ == "dpcp" ? comms.dpcp.get()
                                : comms.ep.get());
  }

  // The empty table of one operation: name, title, columns, notes.
  BenchTable table_of(const CommOp& op, int p, int world_size) const {
    BenchTable t;
    t.name = std::string("comm_") + op.name + (group_ == "world" ? "" : "_" + group_);
    std::ostringstream title;
    title << op.name << " on " << group_ << ": " << world_size / p << " group(s) of " << p
          << " ranks at once, " << (op.elements.empty() ? std::string("float32") : op.elements)
          << ", " << iters_ << " iterations";
    t.title = title.str();
    t.columns = {"size_B", "count", "type", "time_us", "algbw_GB/s", "busbw_GB/s", "#wrong"};
    char factor[32];
    std::snprintf(factor, sizeof factor, "%.4g", op.bus_factor(p));
    t.notes.push_back(std::string("size: ") + op.what + "; busbw = algbw x " + factor + " for " +
                      std::to_string(p) + " ranks; time: slowest rank, mean over iterations");
    return t;
  }

  // One size of one operation: correctness on fresh inputs, then the timed
  // loop on the same buffers; a row of t. Returns the wrong elements (all ranks).
  int64_t measure(const CommOp& op, size_t bytes, Communicator& group, Communicator& world,
                  BenchTable& t) const {
    const int p = group.size();
    const size_t n = op.count(bytes, p);
    if (n == 0) return 0;
    // What is actually moved after rounding down to whole elements per rank.
    const size_t elems = n * op.scale(p), moved = elems * elem_size(op.type);
    op.prepare(group, n);
    op.run(group, n);
    int64_t wrong = op.wrong(group, n);
    world.allreduce_sum(&wrong, 1);
    for (int i = 0; i < warmup_; ++i) op.run(group, n);
    world.barrier();
    const double t0 = now_s();
    for (int i = 0; i < iters_; ++i) op.run(group, n);
    double dt = (now_s() - t0) / iters_;
    world.allreduce_max(&dt, 1);
    const double algbw = double(moved) / dt / 1e9;
    t.add_row({static_cast<long long>(moved), static_cast<long long>(elems),
               std::string(elem_name(op.type)), dt * 1e6, algbw, algbw * op.bus_factor(p),
               static_cast<long long>(wrong)});
    return wrong;
  }

  std::string config_path_;
  std::vector<std::string> sets_;
  std::string group_ = "world";
  std::string ops_ = "allreduce,allgather,alltoall,sendrecv";
  std::string dtypes_ = "float";
  std::string reduce_ops_ = "sum";
  std::string min_bytes_ = "8";
  std::string max_bytes_ = "16M";
  int iters_ = 20;
  int warmup_ = 5;
  std::string output_;
};

}  // namespace

std::unique_ptr<Command> add_bench_comm(CLI::App& parent) {
  auto* app = parent.add_subcommand(
      "comm", "Collective and point-to-point bandwidth per communicator (mpirun)");
  return std::make_unique<BenchCommCommand>(app);
}
}  // namespace trident::cli
