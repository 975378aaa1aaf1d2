// The benchmark engine's shared parts (see trident/bench/engine.hpp).
#include "trident/bench/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "trident/comm/backend.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/reference.hpp"
#include "trident/kernels/staging.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/train/run.hpp"

namespace trident::bench {

std::vector<float> rows_at(const std::vector<int64_t>& positions, int64_t row_elems,
                           const char* name) {
  std::vector<float> x(positions.size() * size_t(row_elems));
  for (size_t t = 0; t < positions.size(); ++t)
    rng::fill_normal(x.data() + t * size_t(row_elems), row_elems, rng::hash_name(name),
                     uint64_t(positions[t] * row_elems), 1.0f);
  return x;
}

std::vector<int64_t> all_positions(int64_t seq) {
  std::vector<int64_t> p(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) p[size_t(i)] = i;
  return p;
}

void SpotCheck::add(const float* got, const double* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t d = 0; d < n; ++d) {
    const double diff = got[d] - ref[d];
    num += diff * diff, den += ref[d] * ref[d];
  }
  const double err = std::sqrt(num / std::max(den, 1e-30));
  worst = std::max(worst, err);
  if (!(err <= tol)) ++wrong;
}

void check_attention_row(SpotCheck& check, const kernels::AttnShape& s, const float* q,
                         const float* k, const float* v, int64_t row, int head,
                         const float* out_row) {
  std::vector<double> ref(static_cast<size_t>(s.D));
  kernels::attention_reference_row(s, q, k, v, row, head, ref.data());
  check.add(out_row, ref.data(), s.D);
}

namespace {
double clock_s(clockid_t id) {
  timespec t;
  clock_gettime(id, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
}  // namespace

double process_cpu_s() { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }
double thread_cpu_s() { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

double device_now_s(const kernels::Ctx& ctx) {
  kernels::synchronize(ctx);
  return now_s();
}

std::vector<double> RankSeries::slowest_per_iteration() const {
  std::vector<double> out(size_t(iters), 0.0);
  for (int r = 0; r < ranks; ++r)
    for (int it = 0; it < iters; ++it) out[size_t(it)] = std::max(out[size_t(it)], at(r, it));
  return out;
}

std::vector<double> RankSeries::median_per_iteration() const {
  std::vector<double> out(static_cast<size_t>(iters));
  for (int it = 0; it < iters; ++it) {
    std::vector<double> col(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) col[size_t(r)] = at(r, it);
    out[size_t(it)] = median(col);
  }
  return out;
}

RankSeries gather_series(Communicator& world, const std::vector<double>& mine) {
  RankSeries s;
  s.ranks = world.size();
  s.iters = int(mine.size());
  s.values.resize(mine.size() * size_t(s.ranks));
  world.allgather(mine.data(), s.values.data(), mine.size() * sizeof(double));
  return s;
}

void print_table(const BenchTable& t, int rank) {
  if (rank != 0) return;
  std::fputs(t.format().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
}

void Verdict::print(int rank) const {
  if (rank != 0) return;
  std::printf("# %s: %lld (%s)\n", label_.c_str(), wrong_, wrong_ ? "FAILED" : "OK");
  std::fflush(stdout);
}

void Verdict::print_error(int rank, const std::string& bench, const std::string& what) const {
  if (rank == 0 && wrong_)
    std::fprintf(stderr, "trident: error: %s: %lld %s\n", bench.c_str(), wrong_, what.c_str());
}

void write_report(const std::string& path, const std::vector<BenchTable>& tables, int rank,
                  const std::string& command_line) {
  if (rank == 0 && !path.empty()) write_bench_file(path, tables, command_line);
}

size_t parse_size(const std::string& flag, const std::string& s) {
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

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

BenchJob open_job(const Config& cfg) {
  BenchJob b;
  b.job = world_communicator(cfg.runtime.timeout_s);
  b.comms = build_communicators(*b.job, cfg, detect_topology(*b.job, cfg));
  const double timeout = cfg.runtime.timeout_s > 0 ? cfg.runtime.timeout_s : 300.0;
  b.all =
      comm_group(*b.job, b.comms->comm_backend, 0, b.job->rank(), CommKind::world, "all", timeout);
  b.device = std::make_unique<kernels::DeviceContext>(b.comms->device);
  train::stage_device_buffers(*b.comms, b.ctx(), timeout);
  if (auto staging = kernels::device_staging(b.ctx(), timeout))
    b.all->stage_device_buffers(staging);
  Communicators& c = *b.comms;
  for (auto* g : {&b.all, &c.world, &c.cp, &c.pp, &c.dp, &c.dpcp, &c.ep, &c.expert_replica})
    if (*g) (*g)->set_compute_stream(b.ctx().stream);
  return b;
}

Communicator& mesh_group(BenchJob& job, const std::string& name) {
  Communicators& c = *job.comms;
  Communicator* g = name == "world"  ? job.all.get()
                    : name == "cp"   ? c.cp.get()
                    : name == "pp"   ? c.pp.get()
                    : name == "dp"   ? c.dp.get()
                    : name == "dpcp" ? c.dpcp.get()
                    : name == "ep"   ? c.ep.get()
                                     : nullptr;
  if (!g) throw InputError("--group " + name + ": must be one of world, cp, pp, dp, dpcp, ep");
  return *g;
}

Tensor to_device(const kernels::Ctx& ctx, const std::vector<float>& v) {
  return kernels::from_host(ctx, v.data(), {int64_t(v.size())}, DType::f32);
}

Tensor device_rows_at(const kernels::Ctx& ctx, const std::vector<int64_t>& positions,
                      int64_t row_elems, const char* name) {
  const std::vector<float> x = rows_at(positions, row_elems, name);
  return kernels::from_host(ctx, x.data(), {int64_t(positions.size()), row_elems}, DType::f32);
}

AttentionTensors::AttentionTensors(const kernels::Ctx& ctx, const std::vector<int64_t>& positions,
                                   int64_t H, int64_t Hkv, int64_t D) {
  const int64_t T = int64_t(positions.size()), q_row = H * D, kv_row = Hkv * D;
  q = device_rows_at(ctx, positions, q_row, "ring.q");
  k = device_rows_at(ctx, positions, kv_row, "ring.k");
  v = device_rows_at(ctx, positions, kv_row, "ring.v");
  dout = device_rows_at(ctx, positions, q_row, "ring.do");
  out = kernels::empty(ctx, {T, q_row}), lse = kernels::empty(ctx, {T, H});
  dq = kernels::empty(ctx, {T, q_row}), dk = kernels::empty(ctx, {T, kv_row});
  dv = kernels::empty(ctx, {T, kv_row});
}

void check_sharded_rows(SpotCheck& check, const kernels::Ctx& ctx, kernels::AttnShape s,
                        const std::vector<int64_t>& positions, const std::vector<int64_t>& rows,
                        const Tensor& out, const char* q_name, const char* k_name,
                        const char* v_name) {
  const int64_t q_row = int64_t(s.H) * s.D, kv_row = int64_t(s.Hkv) * s.D;
  const std::vector<int64_t> all = all_positions(s.Tk);
  const std::vector<float> k = rows_at(all, kv_row, k_name), v = rows_at(all, kv_row, v_name);
  const int32_t* docs = s.k_doc;
  s.Tq = 1;
  for (int64_t i : rows) {
    const int64_t pos = positions[size_t(i)];
    s.q_pos0 = pos;
    if (docs) s.q_doc = docs + pos;
    const std::vector<float> q = rows_at({pos}, q_row, q_name);
    const Tensor got = kernels::to_host(ctx, out.view(i * q_row, {q_row}));
    check_attention_row(check, s, q.data(), k.data(), v.data(), 0, 0, got.ptr());
  }
}

}  // namespace trident::bench
