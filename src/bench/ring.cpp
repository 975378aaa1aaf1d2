// `trident bench ring`: ring attention over all ranks of the job (cp = world
// size), forward + backward, for each layout and local sequence length. The
// job comes from the config (bench::open_job): the ring runs on
// runtime.comm's backend (BenchJob::all) with its buffers on the rank's
// device (runtime.backend), as in training.
// With --cp-mode naming ulysses or hybrid, the modes side by side instead
// (src/bench/cp_modes.cpp); the tables below are the ring's alone.
//
// Per rank: attention FLOPs, compute time, time blocked on the ring, wall
// time, overlap efficiency (compute / wall) and peak attention workspace.
// Per kind of ring step (diagonal, and zig-zag's two off-diagonal kinds of
// equal FLOPs): its time against the same step's mean over ranks. In the
// HDF5 file only: every rank's compute time per iteration and ring step.
// Per case: balance (max/min per-rank compute time and FLOPs) and, with
// --baseline, the one-rank time of the whole sequence, so that the ring's
// wall time can be compared with an ideal 1/cp share of it. The one-rank
// time is measured twice: on rank 0 alone (the other cores idle, so it gets
// the memory bandwidth and clock of a quiet machine), and on every rank at
// once (all cores busy, the conditions the ring runs under); the ratio
// against the second is the fair one, the first is shown next to it.
//
// Every time is the median over --iters iterations, each started by a
// barrier: per rank for the per-rank table; for the ring's wall time, of the
// slowest rank's time per iteration. An iteration runs the one-rank
// references and then every layout's ring back to back, and the ratios of
// ring to reference are taken within an iteration before the median, so
// that this machine's speed drifting between iterations cancels out.
//
// Every rank spot-checks a few of its output rows against the fp64
// definition over the whole sequence (inputs are regenerable from their
// global positions, bench::check_sharded_rows); rows off by more than 1e-4
// count in #wrong and make the exit code 1.
#include "trident/bench/ring.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "trident/bench/engine.hpp"
#include "trident/comm/comm.hpp"
#include "trident/core/clock.hpp"
#include "trident/core/error.hpp"
#include "trident/core/profiler.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/kernels/types/attention.hpp"
#include "trident/parallel/cp/ring_attention.hpp"

namespace trident::bench {
namespace {

// The shapes every case shares.
struct Heads {
  int H, Hkv, D;
};

// One sequence's attention inputs and outputs at the given positions, on
// ctx's device.
struct AttentionData : AttentionTensors {
  AttentionData(const kernels::Ctx& ctx, const std::vector<int64_t>& pos, const Heads& h)
      : AttentionTensors(ctx, pos, h.H, h.Hkv, h.D) {}
  // Forward then backward through ring.
  void run(cp::RingAttention& ring, const Heads& h) {
    ring.forward(q, k, v, h.H, h.Hkv, h.D, out, lse);
    ring.backward(q, k, v, out, lse, dout, h.H, h.Hkv, h.D, dq, dk, dv);
  }
};

// The one-rank reference: forward+backward over the whole sequence with no
// ring. Inputs are allocated on first use (ranks that never run it hold none).
class OneRankJob {
 public:
  OneRankJob(const kernels::Ctx& ctx, int64_t seq, const Heads& h, bool causal)
      : ctx_(ctx), seq_(seq), h_(h), one_(nullptr, cp::Layout::contiguous, causal, seq, ctx) {}

  // One iteration after a barrier of `world` (with run_here on every rank,
  // they run at the same time). Seconds, or NaN where it did not run.
  double iterate(Communicator& world, bool run_here) {
    world.barrier();
    if (!run_here) return NAN;
    if (!data_) data_ = std::make_unique<AttentionData>(ctx_, all_positions(seq_), h_);
    const double t0 = device_now_s(ctx_);
    data_->run(one_, h_);
    return device_now_s(ctx_) - t0;
  }

 private:
  const kernels::Ctx& ctx_;
  int64_t seq_;
  Heads h_;
  cp::RingAttention one_;
  std::unique_ptr<AttentionData> data_;
};

// A lock shared by the ranks of one node (flock on a file): the holder
// computes, the others sleep in the kernel (polling would take the cores
// the holder is being timed on). The deadline is an alarm that interrupts
// the blocked flock.
void on_alarm(int) {}

class ComputeLock {
 public:
  ComputeLock(const std::string& path, double timeout_s) : path_(path), timeout_s_(timeout_s) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd_ < 0) throw Error("bench ring: cannot open the compute lock " + path);
    struct sigaction sa {};
    sa.sa_handler = on_alarm;  // no SA_RESTART: flock returns EINTR
    sigaction(SIGALRM, &sa, nullptr);
  }
  ~ComputeLock() { ::close(fd_); }
  void lock() {
    alarm(static_cast<unsigned>(std::max(1.0, timeout_s_)));
    const int rc = flock(fd_, LOCK_EX);
    alarm(0);
    if (rc != 0)
      throw TimeoutError("bench ring: waited more than " + std::to_string(timeout_s_) +
                         " s for the compute lock " + path_);
  }
  void unlock() { flock(fd_, LOCK_UN); }

 private:
  std::string path_;
  double timeout_s_;
  int fd_ = -1;
};

// The ring's sink in the bench: records one iteration's spans and counters
// and, with --serialize-compute, holds the compute lock around each compute
// span (the waits are not computed, so they take no turn).
class RingRecorder : public prof::Recorder {
 public:
  explicit RingRecorder(ComputeLock* lock) : lock_(lock) {}
  void enter(const char*) override {
    if (lock_) lock_->lock();
  }
  void leave(const char*) override {
    if (lock_) lock_->unlock();
  }

  double compute_s() const { return seconds("ring.forward") + seconds("ring.backward"); }
  // Compute per ring step: cp forward steps, then cp backward steps (a
  // backward step's dK/dV sum included).
  std::vector<double> step_compute_s(int cp) const {
    std::vector<double> steps(2 * size_t(cp), 0.0);
    for (const prof::Span& s : spans()) {
      const std::string kind = s.kind;
      if (kind == "ring.forward") steps[size_t(s.chunk)] += s.seconds();
      if (kind == "ring.backward") steps[size_t(cp + s.chunk)] += s.seconds();
    }
    return steps;
  }

 private:
  ComputeLock* lock_;
};

// One layout's ring on this rank's shard, and what each iteration measured.
struct LayoutCase {
  LayoutCase(const kernels::Ctx& ctx, Communicator* comm, cp::Layout l, bool causal, int64_t seq,
             const Heads& heads, ComputeLock* lock)
      : dev(ctx),
        layout(l),
        ring(comm, l, causal, seq, ctx),
        h(heads),
        data(ctx, ring.positions(), heads),
        work(lock) {
    ring.set_profiler(&work);
  }

  // One forward+backward after a barrier; appends this rank's measurements.
  void iterate(Communicator& world) {
    work.clear();
    world.barrier();
    const double t0 = device_now_s(dev), c0 = process_cpu_s();
    data.run(ring, h);
    walls.push_back(device_now_s(dev) - t0);
    cpus.push_back(process_cpu_s() - c0);
    computes.push_back(work.compute_s());
    compute_cpus.push_back(work.counter("ring.compute_cpu_s"));
    progresses.push_back(work.counter("ring.progress_s"));
    waits.push_back(work.seconds("ring.wait"));
    const auto s = work.step_compute_s(ring.cp_size());
    steps.insert(steps.end(), s.begin(), s.end());
  }

  // Two local rows of head 0 against the fp64 definition over the whole
  // sequence: the worst relative error, and the rows off by more than 1e-4.
  void spot_check(const kernels::Ctx& ctx, int64_t seq, bool causal, double* worst,
                  double* wrong) const {
    const kernels::AttnShape s{1, seq, h.H, h.Hkv, h.D, 1.0f / std::sqrt(float(h.D)), causal, 0, 0};
    const int64_t T = int64_t(ring.positions().size());
    SpotCheck check;
    check_sharded_rows(check, ctx, s, ring.positions(), {0, T - 1}, data.out, "ring.q", "ring.k",
                       "ring.v");
    *worst = std::max(*worst, check.worst);
    *wrong += double(check.wrong);
  }

  const kernels::Ctx& dev;  // where the ring's buffers live (the timers wait for it)
  cp::Layout layout;
  cp::RingAttention ring;
  Heads h;
  AttentionData data;
  RingRecorder work;  // the last iteration's spans and counters
  // Per iteration: this rank's wall and CPU time and what the ring reported;
  // steps: 2*cp entries per iteration (RingRecorder::step_compute_s).
  std::vector<double> walls, cpus, computes, compute_cpus, progresses, waits, steps;
};

// What each rank reports for one case (gathered to rank 0 as doubles).
enum Stat {
  kFlops,
  kCompute,
  kProgress,
  kWait,
  kWall,
  kCpu,
  kComputeCpu,
  kWorkspace,
  kBytes,
  kErr,
  kWrong,
  kNumStats
};

// The four tables' fixed parts (notes as printed under them).
struct RingTables {
  BenchTable per_rank, summary, kinds, steps;
};

RingTables make_tables(int cp, bool causal, const Heads& h, int iters, bool serialized) {
  const std::string mask = causal ? "causal" : "full";
  const std::string median_of = ", median of " + std::to_string(iters) + " iteration(s)";
  TableSpec kinds{
      "ring_step_kinds",
      "Ring attention steps by kind (what the rank computes in the step)",
      {"layout", "seq", "phase", "kind", "steps", "median_ms", "rel_to_step_mean"},
      {"kind: diagonal (own block, causal mask), 2q x 1kv (zig-zag, an earlier rank's block: "
       "both query runs, its first key run), 1q x 2kv (a later rank's block: the second query "
       "run, both key runs), full, masked (contiguous, a later rank's block: nothing "
       "visible); steps: rank-steps of that kind per iteration; rel_to_step_mean: median over "
       "iterations and rank-steps of the time over the mean of all ranks in the same step and "
       "iteration. Kinds of equal FLOPs should be near equal (zig-zag: 2q x 1kv and 1q x 2kv)"}};
  // Written to the HDF5 file only: the per-step times behind compute_rel.
  TableSpec steps{
      "ring_steps",
      "Ring attention compute per rank, iteration and ring step",
      {"layout", "seq", "rank", "iteration", "step", "phase", "source", "compute_ms"},
      {"step: 0..cp-1 forward, cp..2cp-1 backward (phase); source: the rank whose K/V block "
       "the step used; compute_ms: that step's kernel time (dK/dV sum included, MPI tests "
       "excluded). balance_paired is computed from these rows"}};
  TableSpec per_rank{"ring_ranks",
                     "Ring attention per rank: cp=" + std::to_string(cp) + ", " + mask +
                         ", heads " + std::to_string(h.H) + "/" + std::to_string(h.Hkv) +
                         ", head_dim " + std::to_string(h.D) + ", forward+backward" + median_of,
                     {"layout", "seq", "seq/cp", "rank", "GFLOP", "compute_ms", "compute_rel",
                      "progress_ms", "wait_ms", "wall_ms", "cpu_ms", "overlap", "GFLOP/s",
                      "workspace_MiB", "sent_MiB", "max_err", "#wrong"},
                     {}};
  if (serialized)
    per_rank.notes.push_back(
        "--serialize-compute: the ranks took turns in their compute spans, so compute and "
        "balance are each span on a free core; wall, wait and overlap include the turns");
  per_rank.notes.insert(
      per_rank.notes.end(),
      {"compute: time in the attention kernels (LSE merge included) and the dK/dV sums, less "
       "progress: the MPI tests made between query tiles to move the ring's transfers (with "
       "shared memory a test may copy a block); wait: blocked on ring transfers (K/V ahead, "
       "dK/dV behind); wall: forward+backward from a barrier; cpu: the process's CPU time over "
       "the same span (cpu below compute means the rank lost its core to other load while "
       "computing); each the rank's median over iterations; overlap = compute / wall",
       "compute_rel: the rank's compute relative to the average rank, step by step: per ring "
       "step and iteration its time over the mean of all ranks' same step (what the ranks share, "
       "such as the machine's speed at that moment, cancels), median over iterations, steps "
       "weighted by their median cost",
       "GFLOP: attention FLOPs of the rank (forward 4*D, backward 10*D per visible pair and "
       "head); workspace: peak scratch of one call (K/V double buffer, dK/dV partial and "
       "travelling buffers, kernel tiles)"});
  TableSpec summary{
      "ring",
      "Ring attention per case: cp=" + std::to_string(cp) + ", " + mask + median_of,
      {"layout", "seq", "seq/cp", "balance_compute", "balance_paired", "balance_cpu",
       "balance_flops", "overlap_min", "wall_ms", "one_rank_busy_ms", "wall/(busy/cp)",
       "one_rank_alone_ms", "wall/(alone/cp)", "workspace_MiB_max"},
      {"balance_*: max/min over ranks of the per-rank medians (compute: wall time in the "
       "kernels; cpu: the thread's CPU time in the same spans, which time spent waiting for a "
       "core does not inflate, the measure that holds when ranks outnumber cores; paired: "
       "max/min of compute_rel, the estimate least moved by a machine whose speed drifts); "
       "wall_ms: median over iterations of the slowest rank's forward+backward time",
       "one_rank_busy_ms: the whole sequence without a ring, run by every rank at the same time "
       "(all cores busy, as in the ring), median over iterations of the ranks' median; "
       "wall/(busy/cp): the ring's wall over an ideal 1/cp share of it, the like-for-like "
       "ratio, taken in each iteration (the reference runs just before the ring) and then the "
       "median (needs --baseline)",
       "one_rank_alone_ms: the same on rank 0 while the other ranks wait (idle cores leave it "
       "more memory bandwidth and clock); wall/(alone/cp): the ratio against it, for reference"}};
  return {per_rank.make(), summary.make(), kinds.make(), steps.make()};
}

// What rank r computes in a step that holds the K/V block of rank src.
const char* step_kind(bool causal, cp::Layout layout, int r, int src) {
  if (!causal) return "full";
  if (src == r) return "diagonal";
  if (layout == cp::Layout::contiguous) return src < r ? "full" : "masked";
  return src < r ? "2q x 1kv" : "1q x 2kv";
}

// Rows of the step-kind table for one case, from every rank's step times
// t[(r * iters + it) * 2cp + j].
void add_kind_rows(BenchTable& kinds, bool causal, cp::Layout layout, int64_t seq, int cp,
                   int iters, const std::vector<double>& t) {
  const size_t n_steps = 2 * size_t(cp);
  auto at = [&](int r, int it, int j) {
    return t[(size_t(r) * size_t(iters) + size_t(it)) * n_steps + size_t(j)];
  };
  for (const int j0 : {0, cp}) {
    const char* phase = j0 == 0 ? "forward" : "backward";
    std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by_kind;
    for (int j = j0; j < j0 + cp; ++j)
      for (int it = 0; it < iters; ++it) {
        double mean = 0;
        for (int r = 0; r < cp; ++r) mean += at(r, it, j) / cp;
        for (int r = 0; r < cp; ++r) {
          auto& k = by_kind[step_kind(causal, layout, r, (r - (j - j0) + cp) % cp)];
          k.first.push_back(at(r, it, j));
          k.second.push_back(mean > 0 ? at(r, it, j) / mean : 1.0);
        }
      }
    for (const auto& [kind, v] : by_kind)
      kinds.add_row({std::string(cp::layout_name(layout)), static_cast<long long>(seq),
                     std::string(phase), kind, static_cast<long long>(v.first.size() / iters),
                     median(v.first) * 1e3, median(v.second)});
  }
}

// Rows of the per-step table (HDF5 only) for one case.
void add_step_rows(BenchTable& steps, cp::Layout layout, int64_t seq, int cp, int iters,
                   const std::vector<double>& t) {
  for (int r = 0; r < cp; ++r)
    for (int it = 0; it < iters; ++it)
      for (int j = 0; j < 2 * cp; ++j) {
        const int step = j % cp;
        steps.add_row(
            {std::string(cp::layout_name(layout)), static_cast<long long>(seq),
             static_cast<long long>(r), static_cast<long long>(it), static_cast<long long>(j),
             std::string(j < cp ? "forward" : "backward"),
             static_cast<long long>((r - step + cp) % cp),
             t[(size_t(r) * size_t(iters) + size_t(it)) * size_t(2 * cp) + size_t(j)] * 1e3});
      }
}

// The one-rank reference per iteration: alone (rank 0's) and busy (median
// over the ranks, which ran it at the same time). NaN without --baseline.
struct Baseline {
  std::vector<double> alone, busy;
};

Baseline baseline_per_iteration(Communicator& world, const std::vector<double>& alone,
                                const std::vector<double>& busy, int iters) {
  Baseline b{std::vector<double>(size_t(iters), NAN), std::vector<double>(size_t(iters), NAN)};
  if (busy.empty()) return b;
  const RankSeries all_alone = gather_series(world, alone);
  b.busy = gather_series(world, busy).median_per_iteration();
  for (int it = 0; it < iters; ++it) b.alone[size_t(it)] = all_alone.at(0, it);
  return b;
}

// Median over iterations of wall / (reference / cp), each iteration's ring
// against the reference taken just before it.
double ratio_to_share(const std::vector<double>& walls, const std::vector<double>& reference,
                      int cp) {
  std::vector<double> r(walls.size());
  for (size_t it = 0; it < walls.size(); ++it) r[it] = walls[it] / (reference[it] / cp);
  return median(r);
}

// This rank's medians and totals for one case, gathered from every rank.
std::vector<double> gather_stats(Communicator& world, const kernels::Ctx& ctx, const LayoutCase& lc,
                                 int64_t seq, bool causal) {
  double stats[kNumStats] = {};
  lc.spot_check(ctx, seq, causal, &stats[kErr], &stats[kWrong]);
  stats[kFlops] = lc.work.counter("ring.flops");  // the same every iteration
  stats[kCompute] = median(lc.computes);
  stats[kProgress] = median(lc.progresses);
  stats[kWait] = median(lc.waits);
  stats[kWall] = median(lc.walls);
  stats[kCpu] = median(lc.cpus);
  stats[kComputeCpu] = median(lc.compute_cpus);
  stats[kWorkspace] = lc.work.counter("ring.workspace_bytes");
  stats[kBytes] = lc.work.counter("ring.bytes_sent");
  std::vector<double> all(size_t(kNumStats) * size_t(world.size()));
  world.allgather(stats, all.data(), sizeof stats);
  return all;
}

// The ring's own tables (not --cp-mode, not --docs) over the ranks of world.
class RingBench {
 public:
  RingBench(const RingBenchOptions& o, BenchJob& job)
      : o_(o), job_(job), h_{o.heads, o.kv_heads, o.head_dim} {}
  // Every case on the job's ranks; returns the exit code.
  int run();

 private:
  void measure(Communicator& world, Communicator& ring_comm, int64_t T, ComputeLock* lock);
  void add_case_rows(Communicator& world, LayoutCase& lc, int64_t T, const Baseline& base);
  void report(int rank) const;

  const RingBenchOptions& o_;
  BenchJob& job_;  // world(): control and gathers; all: the ring; ctx(): the buffers
  Heads h_;
  RingTables tables_;
  Verdict verdict_{"wrong rows in total"};
};

// One local sequence length: every iteration runs the one-rank reference of
// the whole sequence (alone on rank 0 while the others wait, then on every
// rank at once) and then each layout's ring, back to back, so that each ring
// iteration has its own baseline taken moments before it.
void RingBench::measure(Communicator& world, Communicator& ring_comm, int64_t T,
                        ComputeLock* lock) {
  const int cp = world.size();
  const int64_t seq = T * cp;
  std::vector<std::unique_ptr<LayoutCase>> cases;
  for (cp::Layout layout : o_.layouts) {
    cp::check_layout(seq, cp, layout);
    cases.push_back(
        std::make_unique<LayoutCase>(job_.ctx(), &ring_comm, layout, o_.causal, seq, h_, lock));
  }
  std::unique_ptr<OneRankJob> one;
  if (o_.baseline) one = std::make_unique<OneRankJob>(job_.ctx(), seq, h_, o_.causal);
  std::vector<double> alone, busy;  // per iteration: rank 0's; this rank's
  for (int it = 0; it < o_.iters; ++it) {
    if (one) {
      alone.push_back(one->iterate(world, world.rank() == 0));
      busy.push_back(one->iterate(world, true));
    }
    for (auto& lc : cases) lc->iterate(world);
  }
  const Baseline base = baseline_per_iteration(world, alone, busy, o_.iters);
  for (auto& lc : cases) {
    add_case_rows(world, *lc, T, base);
    if (world.rank() == 0)
      std::fprintf(stderr, "  done: %s seq/cp %lld\n", cp::layout_name(lc->layout),
                   static_cast<long long>(T));
  }
}

// One case's rows: per rank, per step kind, per step (HDF5 only) and the summary.
void RingBench::add_case_rows(Communicator& world, LayoutCase& lc, int64_t T,
                              const Baseline& base) {
  const int cp = world.size();
  const int64_t seq = T * cp;
  const std::string layout = cp::layout_name(lc.layout);
  // The ring's wall time of an iteration is its slowest rank's.
  const std::vector<double> iter_walls = gather_series(world, lc.walls).slowest_per_iteration();
  const RankSeries steps = gather_series(world, lc.steps);
  const auto rel = paired_relative_cost(steps.values, cp, o_.iters, 2 * cp);
  if (world.rank() == 0) {
    add_kind_rows(tables_.kinds, o_.causal, lc.layout, seq, cp, o_.iters, steps.values);
    add_step_rows(tables_.steps, lc.layout, seq, cp, o_.iters, steps.values);
  }
  const std::vector<double> all = gather_stats(world, job_.ctx(), lc, seq, o_.causal);
  double cmax = 0, cmin = 1e300, fmax = 0, fmin = 1e300, omin = 1e300, wsmax = 0;
  double umax = 0, umin = 1e300, pmax = 0, pmin = 1e300;
  for (int r = 0; r < cp; ++r) {
    const double* st = all.data() + size_t(r) * kNumStats;
    cmax = std::max(cmax, st[kCompute]), cmin = std::min(cmin, st[kCompute]);
    umax = std::max(umax, st[kComputeCpu]), umin = std::min(umin, st[kComputeCpu]);
    fmax = std::max(fmax, st[kFlops]), fmin = std::min(fmin, st[kFlops]);
    pmax = std::max(pmax, rel[size_t(r)]), pmin = std::min(pmin, rel[size_t(r)]);
    omin = std::min(omin, st[kCompute] / st[kWall]);
    wsmax = std::max(wsmax, st[kWorkspace]);
    verdict_.add(static_cast<long long>(st[kWrong]));
    tables_.per_rank.add_row(
        {layout, static_cast<long long>(seq), static_cast<long long>(T), static_cast<long long>(r),
         st[kFlops] / 1e9, st[kCompute] * 1e3, rel[size_t(r)], st[kProgress] * 1e3, st[kWait] * 1e3,
         st[kWall] * 1e3, st[kCpu] * 1e3, st[kCompute] / st[kWall], st[kFlops] / st[kCompute] / 1e9,
         st[kWorkspace] / 1048576.0, st[kBytes] / 1048576.0, st[kErr],
         static_cast<long long>(st[kWrong])});
  }
  const bool ref = o_.baseline;
  tables_.summary.add_row(
      {layout, static_cast<long long>(seq), static_cast<long long>(T), cmax / cmin, pmax / pmin,
       umax / umin, fmax / fmin, omin, median(iter_walls) * 1e3,
       ref ? median(base.busy) * 1e3 : NAN, ref ? ratio_to_share(iter_walls, base.busy, cp) : NAN,
       ref ? median(base.alone) * 1e3 : NAN, ref ? ratio_to_share(iter_walls, base.alone, cp) : NAN,
       wsmax / 1048576.0});
}

void RingBench::report(int rank) const {
  if (rank == 0) {
    std::fputs(tables_.per_rank.format().c_str(), stdout);
    std::fputs("\n", stdout);
    std::fputs(tables_.summary.format().c_str(), stdout);
    std::fputs("\n", stdout);
    std::fputs(tables_.kinds.format().c_str(), stdout);
    std::fflush(stdout);
  }
  verdict_.print(rank);
  write_report(o_.output, {tables_.per_rank, tables_.summary, tables_.kinds, tables_.steps}, rank,
               o_.command_line);
}

int RingBench::run() {
  Communicator &world = job_.world(), &ring_comm = *job_.all;
  const int cp = world.size(), rank = world.rank();
  // --serialize-compute: one lock file for the job, named by rank 0.
  std::unique_ptr<ComputeLock> lock;
  std::string lock_path;
  if (o_.serialize) {
    char name[128] = {};
    if (rank == 0)
      std::snprintf(name, sizeof name, "/tmp/trident-ring-compute-%d.lock", int(getpid()));
    world.broadcast(name, sizeof name, 0);
    lock_path = name;
    lock = std::make_unique<ComputeLock>(lock_path, o_.timeout_s);
  }
  tables_ = make_tables(cp, o_.causal, h_, o_.iters, o_.serialize);
  for (int64_t T : o_.seq_per_rank) measure(world, ring_comm, T, lock.get());
  report(rank);
  world.barrier();
  if (lock && rank == 0) ::unlink(lock_path.c_str());
  verdict_.print_error(rank, "bench ring", "output rows differ from the fp64 reference");
  return verdict_.exit_code();
}

}  // namespace

int run_ring_bench(const Config& cfg, const RingBenchOptions& opt) {
  BenchJob job = open_job(cfg);
  return RingBench(opt, job).run();
}

}  // namespace trident::bench
