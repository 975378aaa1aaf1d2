// `trident bench ring`: ring attention over all ranks of the job (cp = world
// size), forward + backward, for each layout and local sequence length.
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
// global positions); rows off by more than 1e-4 count in #wrong and make the
// exit code 1.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <sstream>

#include "commands.hpp"
#include "list_flags.hpp"
#include "trident/comm/backend.hpp"
#include "trident/comm/comm.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/parallel/cp/ring_attention.hpp"

namespace trident::cli {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Rows of a [seq, heads, D] tensor at the given global positions; element
// (p, h, d) is the same number whichever rank generates it.
std::vector<float> rows_at(const std::vector<int64_t>& positions, int64_t row_elems,
                           const char* name) {
  std::vector<float> x(positions.size() * size_t(row_elems));
  for (size_t t = 0; t < positions.size(); ++t)
    rng::fill_normal(x.data() + t * size_t(row_elems), row_elems, rng::hash_name(name),
                     uint64_t(positions[t] * row_elems), 1.0f);
  return x;
}

// CPU time of this process (all its threads), seconds.
double cpu_seconds_now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

std::vector<int64_t> all_positions(int64_t seq) {
  std::vector<int64_t> p(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) p[size_t(i)] = i;
  return p;
}

// The one-rank reference: forward+backward over the whole sequence with no
// ring. Inputs are allocated on first use (ranks that never run it hold none).
class OneRankJob {
 public:
  OneRankJob(int64_t seq, int H, int Hkv, int D, bool causal)
      : seq_(seq), H_(H), Hkv_(Hkv), D_(D), one_(nullptr, cp::Layout::contiguous, causal, seq) {}

  // One iteration after a barrier of `world` (with run_here on every rank,
  // they run at the same time). Seconds, or NaN where it did not run.
  double iterate(Communicator& world, bool run_here) {
    world.barrier();
    if (!run_here) return NAN;
    if (q_.empty()) {
      const auto all = all_positions(seq_);
      q_ = rows_at(all, int64_t(H_) * D_, "ring.q"), k_ = rows_at(all, int64_t(Hkv_) * D_, "ring.k");
      v_ = rows_at(all, int64_t(Hkv_) * D_, "ring.v"), do_ = rows_at(all, int64_t(H_) * D_, "ring.do");
      out_.resize(q_.size()), lse_.resize(size_t(seq_ * H_)), dq_.resize(q_.size());
      dk_.resize(k_.size()), dv_.resize(v_.size());
    }
    const double t0 = seconds_now();
    one_.forward(q_.data(), k_.data(), v_.data(), H_, Hkv_, D_, out_.data(), lse_.data());
    one_.backward(q_.data(), k_.data(), v_.data(), out_.data(), lse_.data(), do_.data(), H_, Hkv_,
                  D_, dq_.data(), dk_.data(), dv_.data());
    return seconds_now() - t0;
  }

 private:
  int64_t seq_;
  int H_, Hkv_, D_;
  cp::RingAttention one_;
  std::vector<float> q_, k_, v_, do_, out_, lse_, dq_, dk_, dv_;
};

// One layout's ring on this rank's shard, and what each iteration measured.
struct LayoutCase {
  LayoutCase(Communicator* comm, cp::Layout l, bool causal, int64_t seq, int h, int hkv, int d)
      : layout(l), ring(comm, l, causal, seq), H(h), Hkv(hkv), D(d) {
    ring.set_record_steps(true);
    const auto& pos = ring.positions();
    q = rows_at(pos, int64_t(H) * D, "ring.q"), k = rows_at(pos, int64_t(Hkv) * D, "ring.k");
    v = rows_at(pos, int64_t(Hkv) * D, "ring.v"), dout = rows_at(pos, int64_t(H) * D, "ring.do");
    out.resize(q.size()), lse.resize(pos.size() * size_t(H)), dq.resize(q.size());
    dk.resize(k.size()), dv.resize(v.size());
  }

  // One forward+backward after a barrier; appends this rank's measurements.
  void iterate(Communicator& world) {
    ring.reset_counters();
    world.barrier();
    const double t0 = seconds_now(), c0 = cpu_seconds_now();
    ring.forward(q.data(), k.data(), v.data(), H, Hkv, D, out.data(), lse.data());
    ring.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), H, Hkv, D,
                  dq.data(), dk.data(), dv.data());
    walls.push_back(seconds_now() - t0);
    cpus.push_back(cpu_seconds_now() - c0);
    const cp::RingCounters& c = ring.counters();
    computes.push_back(c.compute_s);
    compute_cpus.push_back(c.compute_cpu_s);
    progresses.push_back(c.progress_s);
    waits.push_back(c.wait_s);
    const size_t n_steps = 2 * size_t(ring.cp_size());
    TRIDENT_CHECK(c.step_compute_s.size() == n_steps,
                  "bench ring: expected " + std::to_string(n_steps) + " ring steps per iteration");
    steps.insert(steps.end(), c.step_compute_s.begin(), c.step_compute_s.end());
  }

  // Two local rows of head 0 against the fp64 definition over the whole
  // sequence: the worst relative error, and the rows off by more than 1e-4.
  void spot_check(int64_t seq, bool causal, double* worst, double* wrong) const {
    const auto all = all_positions(seq);
    auto gk = rows_at(all, int64_t(Hkv) * D, "ring.k"), gv = rows_at(all, int64_t(Hkv) * D, "ring.v");
    kernels::AttnShape s{1, seq, H, Hkv, D, 1.0f / std::sqrt(float(D)), causal, 0, 0};
    std::vector<double> ref(static_cast<size_t>(D));
    const auto& pos = ring.positions();
    const int64_t T = int64_t(pos.size());
    for (int64_t i : {int64_t(0), T - 1}) {
      s.q_pos0 = pos[size_t(i)];
      kernels::attention_reference_row(s, q.data() + i * H * D, gk.data(), gv.data(), 0, 0,
                                        ref.data());
      double num = 0, den = 0;
      for (int d = 0; d < D; ++d) {
        const double diff = out[size_t(i * H * D + d)] - ref[size_t(d)];
        num += diff * diff, den += ref[size_t(d)] * ref[size_t(d)];
      }
      const double err = std::sqrt(num / std::max(den, 1e-30));
      *worst = std::max(*worst, err);
      if (!(err <= 1e-4)) *wrong += 1;
    }
  }

  cp::Layout layout;
  cp::RingAttention ring;
  int H, Hkv, D;
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
  // Per iteration: this rank's wall and CPU time and its ring counters;
  // steps: 2*cp entries per iteration (RingCounters::step_compute_s).
  std::vector<double> walls, cpus, computes, compute_cpus, progresses, waits, steps;
};

// What each rank reports for one case (gathered to rank 0 as doubles).
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

enum Stat {
  kFlops, kCompute, kProgress, kWait, kWall, kCpu, kComputeCpu, kWorkspace, kBytes, kErr, kWrong,
  kNumStats
};

class BenchRingCommand : public Command {
 public:
  explicit BenchRingCommand(CLI::App* app) {
    app->add_option("--seq-per-rank", seq_per_rank_, "Local tokens per rank, comma-separated");
    app->add_option("--layout", layout_, "zigzag, contiguous or both");
    app->add_flag("--causal", causal_, "Causal mask (default: full attention)");
    app->add_option("--heads", heads_, "Query heads");
    app->add_option("--kv-heads", kv_heads_, "Key/value heads (default: = heads)");
    app->add_option("--head-dim", head_dim_, "Head dimension");
    app->add_option("--iters", iters_, "Timed forward+backward iterations per case");
    app->add_flag("--baseline", baseline_,
                  "Also time the whole sequence on one rank (one-rank reference): on rank 0 "
                  "alone, and on every rank at once");
    app->add_flag("--serialize-compute", serialize_,
                  "Ranks take turns in their compute spans (a file lock around each), so that "
                  "with more ranks than cores every span is timed on a free core: compute and "
                  "balance are then the work's own; wall and overlap are not meaningful");
    app->add_option("--threads", threads_, "BLAS threads per rank");
    app->add_option("--timeout", timeout_s_, "Deadline of any single wait, seconds");
    app->add_option("--output", output_, "Write the tables to this HDF5 file");
  }

  bool needs_mpi() const override { return true; }

 private:
  // What rank r computes in a step that holds the K/V block of rank src.
  const char* step_kind(cp::Layout layout, int r, int src) const {
    if (!causal_) return "full";
    if (src == r) return "diagonal";
    if (layout == cp::Layout::contiguous) return src < r ? "full" : "masked";
    return src < r ? "2q x 1kv" : "1q x 2kv";
  }

  // Rows of the step-kind table for one case, from every rank's step times
  // t[(r * iters + it) * 2cp + j].
  void add_kind_rows(BenchTable& kinds, cp::Layout layout, int64_t seq, int cp,
                     const std::vector<double>& t) const {
    const size_t n_steps = 2 * size_t(cp);
    auto at = [&](int r, int it, int j) {
      return t[(size_t(r) * size_t(iters_) + size_t(it)) * n_steps + size_t(j)];
    };
    for (const int j0 : {0, cp}) {
      const char* phase = j0 == 0 ? "forward" : "backward";
      std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by_kind;
      for (int j = j0; j < j0 + cp; ++j)
        for (int it = 0; it < iters_; ++it) {
          double mean = 0;
          for (int r = 0; r < cp; ++r) mean += at(r, it, j) / cp;
          for (int r = 0; r < cp; ++r) {
            auto& k = by_kind[step_kind(layout, r, (r - (j - j0) + cp) % cp)];
            k.first.push_back(at(r, it, j));
            k.second.push_back(mean > 0 ? at(r, it, j) / mean : 1.0);
          }
        }
      for (const auto& [kind, v] : by_kind)
        kinds.add_row({std::string(cp::layout_name(layout)), static_cast<long long>(seq),
                       std::string(phase), kind, static_cast<long long>(v.first.size() / iters_),
                       median(v.first) * 1e3, median(v.second)});
    }
  }

 public:

  int run() override {
    const auto seqs = parse_positive_list("--seq-per-rank", seq_per_rank_);
    std::vector<cp::Layout> layouts;
    if (layout_ == "both") layouts = {cp::Layout::contiguous, cp::Layout::zigzag};
    else if (layout_ == "zigzag" || layout_ == "contiguous") layouts = {cp::parse_layout(layout_)};
    else throw InputError("--layout " + layout_ + ": must be zigzag, contiguous or both");
    if (kv_heads_ == 0) kv_heads_ = heads_;
    if (heads_ < 1 || kv_heads_ < 1 || heads_ % kv_heads_ != 0)
      throw InputError("--heads " + std::to_string(heads_) + " --kv-heads " +
                       std::to_string(kv_heads_) + ": heads must be a positive multiple of kv-heads");
    if (head_dim_ < 1) throw InputError("--head-dim " + std::to_string(head_dim_) + ": must be >= 1");
    if (iters_ < 1) throw InputError("--iters " + std::to_string(iters_) + ": must be >= 1");
    if (threads_ < 1) throw InputError("--threads " + std::to_string(threads_) + ": must be >= 1");
    if (!(timeout_s_ > 0)) throw InputError("--timeout: must be > 0");
    for (int64_t t : seqs)
      if (t % 2 != 0)
        throw InputError("--seq-per-rank " + seq_per_rank_ + ": " + std::to_string(t) +
                         " is odd (a zig-zag rank holds two equal chunks)");
    kernels::set_blas_threads(threads_);

    auto job = world_communicator(timeout_s_);
    auto ring_group =
        comm_group(*job, CommBackend::mpi, 0, job->rank(), CommKind::cp, "cp", timeout_s_);
    Communicator &ring_comm = *ring_group, &world = *job;
    const int cp = world.size(), rank = world.rank();
    const int H = heads_, Hkv = kv_heads_, D = head_dim_;
    // --serialize-compute: one lock file for the job, named by rank 0.
    std::unique_ptr<ComputeLock> gate;
    std::string gate_path;
    if (serialize_) {
      char name[128] = {};
      if (rank == 0)
        std::snprintf(name, sizeof name, "/tmp/trident-ring-compute-%d.lock", int(getpid()));
      world.broadcast(name, sizeof name, 0);
      gate_path = name;
      gate = std::make_unique<ComputeLock>(gate_path, timeout_s_);
    }

    BenchTable per_rank, summary, step_table, kinds;
    kinds.name = "ring_step_kinds";
    kinds.title = "Ring attention steps by kind (what the rank computes in the step)";
    kinds.columns = {"layout", "seq", "phase", "kind", "steps", "median_ms", "rel_to_step_mean"};
    kinds.notes.push_back(
        "kind: diagonal (own block, causal mask), 2q x 1kv (zig-zag, an earlier rank's block: "
        "both query runs, its first key run), 1q x 2kv (a later rank's block: the second query "
        "run, both key runs), full, masked (contiguous, a later rank's block: nothing "
        "visible); steps: rank-steps of that kind per iteration; rel_to_step_mean: median over "
        "iterations and rank-steps of the time over the mean of all ranks in the same step and "
        "iteration. Kinds of equal FLOPs should be near equal (zig-zag: 2q x 1kv and 1q x 2kv)");
    // Written to the HDF5 file only: the per-step times behind compute_rel.
    step_table.name = "ring_steps";
    step_table.title = "Ring attention compute per rank, iteration and ring step";
    step_table.columns = {"layout", "seq",   "rank",   "iteration",
                          "step",   "phase", "source", "compute_ms"};
    step_table.notes.push_back(
        "step: 0..cp-1 forward, cp..2cp-1 backward (phase); source: the rank whose K/V block "
        "the step used; compute_ms: that step's kernel time (dK/dV sum included, MPI tests "
        "excluded). balance_paired is computed from these rows");
    per_rank.name = "ring_ranks";
    per_rank.title = "Ring attention per rank: cp=" + std::to_string(cp) + ", " +
                     (causal_ ? "causal" : "full") + ", heads " + std::to_string(H) + "/" +
                     std::to_string(Hkv) + ", head_dim " + std::to_string(D) + ", forward+backward";
    per_rank.columns = {"layout",   "seq",           "seq/cp",   "rank",        "GFLOP",
                        "compute_ms", "compute_rel",  "progress_ms", "wait_ms", "wall_ms",
                        "cpu_ms",   "overlap",       "GFLOP/s",  "workspace_MiB", "sent_MiB",
                        "max_err",  "#wrong"};
    summary.name = "ring";
    summary.title = "Ring attention per case: cp=" + std::to_string(cp) + ", " +
                    (causal_ ? "causal" : "full") + ", median of " + std::to_string(iters_) +
                    " iteration(s)";
    summary.columns = {"layout",          "seq",
                       "seq/cp",          "balance_compute",
                       "balance_paired",  "balance_cpu",
                       "balance_flops",
                       "overlap_min",
                       "wall_ms",         "one_rank_busy_ms",
                       "wall/(busy/cp)",  "one_rank_alone_ms",
                       "wall/(alone/cp)", "workspace_MiB_max"};
    per_rank.title += ", median of " + std::to_string(iters_) + " iteration(s)";

    long long total_wrong = 0;
    for (int64_t T : seqs) {
      const int64_t seq = T * cp;
      std::vector<std::unique_ptr<LayoutCase>> cases;
      for (cp::Layout layout : layouts) {
        cp::check_layout(seq, cp, layout);
        cases.push_back(std::make_unique<LayoutCase>(&ring_comm, layout, causal_, seq, H, Hkv, D));
        if (gate)
          cases.back()->ring.set_compute_gate([&] { gate->lock(); }, [&] { gate->unlock(); });
      }
      // Every iteration runs the one-rank reference of the whole sequence
      // (alone on rank 0 while the others wait, then on every rank at once)
      // and then each layout's ring, back to back, so that each ring
      // iteration has its own baseline taken moments before it.
      std::unique_ptr<OneRankJob> one;
      if (baseline_) one = std::make_unique<OneRankJob>(seq, H, Hkv, D, causal_);
      std::vector<double> alone, busy;  // per iteration: rank 0's; this rank's
      for (int it = 0; it < iters_; ++it) {
        if (one) {
          alone.push_back(one->iterate(world, rank == 0));
          busy.push_back(one->iterate(world, true));
        }
        for (auto& lc : cases) lc->iterate(world);
      }
      // Per iteration: the one-rank time alone (rank 0's) and busy (median
      // over the ranks, which ran it at the same time).
      std::vector<double> alone_it(size_t(iters_), NAN), busy_it(size_t(iters_), NAN);
      if (one) {
        std::vector<double> all_alone(size_t(iters_) * cp), all_busy(size_t(iters_) * cp);
        world.allgather(alone.data(), all_alone.data(), alone.size() * sizeof(double));
        world.allgather(busy.data(), all_busy.data(), busy.size() * sizeof(double));
        for (int it = 0; it < iters_; ++it) {
          std::vector<double> b(static_cast<size_t>(cp));
          for (int r = 0; r < cp; ++r) b[size_t(r)] = all_busy[size_t(r) * iters_ + size_t(it)];
          busy_it[size_t(it)] = median(b);
          alone_it[size_t(it)] = all_alone[size_t(it)];  // rank 0's row
        }
      }

      for (auto& lcp : cases) {
        LayoutCase& lc = *lcp;
        const cp::Layout layout = lc.layout;
        // The ring's wall time of an iteration is its slowest rank's.
        std::vector<double> all_walls(size_t(iters_) * cp), iter_walls(size_t(iters_), 0.0);
        world.allgather(lc.walls.data(), all_walls.data(), lc.walls.size() * sizeof(double));
        for (int r = 0; r < cp; ++r)
          for (int it = 0; it < iters_; ++it)
            iter_walls[size_t(it)] =
                std::max(iter_walls[size_t(it)], all_walls[size_t(r) * iters_ + size_t(it)]);
        const double ring_wall = median(iter_walls);
        // Ratios against the ideal 1/cp share of the one-rank time, taken
        // within each iteration and then the median (NaN without --baseline).
        double busy_ratio = NAN, alone_ratio = NAN;
        if (one) {
          std::vector<double> rb(static_cast<size_t>(iters_)), ra(static_cast<size_t>(iters_));
          for (int it = 0; it < iters_; ++it) {
            rb[size_t(it)] = iter_walls[size_t(it)] / (busy_it[size_t(it)] / cp);
            ra[size_t(it)] = iter_walls[size_t(it)] / (alone_it[size_t(it)] / cp);
          }
          busy_ratio = median(rb), alone_ratio = median(ra);
        }
        std::vector<double> all_steps(lc.steps.size() * size_t(cp));
        world.allgather(lc.steps.data(), all_steps.data(), lc.steps.size() * sizeof(double));
        const auto rel = paired_relative_cost(all_steps, cp, iters_, 2 * cp);
        if (rank == 0) add_kind_rows(kinds, layout, seq, cp, all_steps);
        if (rank == 0)
          for (int r = 0; r < cp; ++r)
            for (int it = 0; it < iters_; ++it)
              for (int j = 0; j < 2 * cp; ++j) {
                const int step = j % cp;
                step_table.add_row(
                    {std::string(cp::layout_name(layout)), static_cast<long long>(seq),
                     static_cast<long long>(r), static_cast<long long>(it),
                     static_cast<long long>(j), std::string(j < cp ? "forward" : "backward"),
                     static_cast<long long>((r - step + cp) % cp),
                     all_steps[(size_t(r) * size_t(iters_) + size_t(it)) * size_t(2 * cp) +
                               size_t(j)] *
                         1e3});
              }

        double stats[kNumStats] = {};
        lc.spot_check(seq, causal_, &stats[kErr], &stats[kWrong]);
        const cp::RingCounters& c = lc.ring.counters();
        stats[kFlops] = c.flops;  // the same every iteration
        stats[kCompute] = median(lc.computes);
        stats[kProgress] = median(lc.progresses);
        stats[kWait] = median(lc.waits);
        stats[kWall] = median(lc.walls);
        stats[kCpu] = median(lc.cpus);
        stats[kComputeCpu] = median(lc.compute_cpus);
        stats[kWorkspace] = double(c.peak_workspace_bytes);
        stats[kBytes] = c.bytes_sent;
        std::vector<double> all_stats(size_t(kNumStats) * cp);
        world.allgather(stats, all_stats.data(), sizeof stats);

        double cmax = 0, cmin = 1e300, fmax = 0, fmin = 1e300, omin = 1e300, wsmax = 0;
        double umax = 0, umin = 1e300, pmax = 0, pmin = 1e300;
        for (int r = 0; r < cp; ++r) {
          const double* st = all_stats.data() + size_t(r) * kNumStats;
          cmax = std::max(cmax, st[kCompute]), cmin = std::min(cmin, st[kCompute]);
          umax = std::max(umax, st[kComputeCpu]), umin = std::min(umin, st[kComputeCpu]);
          fmax = std::max(fmax, st[kFlops]), fmin = std::min(fmin, st[kFlops]);
          pmax = std::max(pmax, rel[size_t(r)]), pmin = std::min(pmin, rel[size_t(r)]);
          omin = std::min(omin, st[kCompute] / st[kWall]);
          wsmax = std::max(wsmax, st[kWorkspace]);
          total_wrong += static_cast<long long>(st[kWrong]);
          per_rank.add_row({std::string(cp::layout_name(layout)), static_cast<long long>(seq),
                            static_cast<long long>(T), static_cast<long long>(r), st[kFlops] / 1e9,
                            st[kCompute] * 1e3, rel[size_t(r)], st[kProgress] * 1e3,
                            st[kWait] * 1e3, st[kWall] * 1e3, st[kCpu] * 1e3,
                            st[kCompute] / st[kWall], st[kFlops] / st[kCompute] / 1e9,
                            st[kWorkspace] / 1048576.0, st[kBytes] / 1048576.0, st[kErr],
                            static_cast<long long>(st[kWrong])});
        }
        const double busy_s = one ? median(busy_it) : NAN, alone_s = one ? median(alone_it) : NAN;
        summary.add_row({std::string(cp::layout_name(layout)), static_cast<long long>(seq),
                         static_cast<long long>(T), cmax / cmin, pmax / pmin, umax / umin,
                         fmax / fmin, omin, ring_wall * 1e3, busy_s * 1e3, busy_ratio,
                         alone_s * 1e3, alone_ratio, wsmax / 1048576.0});
        if (rank == 0)
          std::fprintf(stderr, "  done: %s seq/cp %lld\n", cp::layout_name(layout),
                       static_cast<long long>(T));
      }
    }
    if (serialize_)
      per_rank.notes.push_back(
          "--serialize-compute: the ranks took turns in their compute spans, so compute and "
          "balance are each span on a free core; wall, wait and overlap include the turns");
    per_rank.notes.push_back(
        "compute: time in the attention kernels (LSE merge included) and the dK/dV sums, less "
        "progress: the MPI tests made between query tiles to move the ring's transfers (with "
        "shared memory a test may copy a block); wait: blocked on ring transfers (K/V ahead, "
        "dK/dV behind); wall: forward+backward from a barrier; cpu: the process's CPU time over "
        "the same span (cpu below compute means the rank lost its core to other load while "
        "computing); each the rank's median over iterations; overlap = compute / wall");
    per_rank.notes.push_back(
        "compute_rel: the rank's compute relative to the average rank, step by step: per ring "
        "step and iteration its time over the mean of all ranks' same step (what the ranks share, "
        "such as the machine's speed at that moment, cancels), median over iterations, steps "
        "weighted by their median cost");
    per_rank.notes.push_back(
        "GFLOP: attention FLOPs of the rank (forward 4*D, backward 10*D per visible pair and "
        "head); workspace: peak scratch of one call (K/V double buffer, dK/dV partial and "
        "travelling buffers, kernel tiles)");
    summary.notes.push_back(
        "balance_*: max/min over ranks of the per-rank medians (compute: wall time in the "
        "kernels; cpu: the thread's CPU time in the same spans, which time spent waiting for a "
        "core does not inflate, the measure that holds when ranks outnumber cores; paired: "
        "max/min of compute_rel, the estimate least moved by a machine whose speed drifts); "
        "wall_ms: median over iterations of the slowest rank's forward+backward time");
    summary.notes.push_back(
        "one_rank_busy_ms: the whole sequence without a ring, run by every rank at the same time "
        "(all cores busy, as in the ring), median over iterations of the ranks' median; "
        "wall/(busy/cp): the ring's wall over an ideal 1/cp share of it, the like-for-like "
        "ratio, taken in each iteration (the reference runs just before the ring) and then the "
        "median (needs --baseline)");
    summary.notes.push_back(
        "one_rank_alone_ms: the same on rank 0 while the other ranks wait (idle cores leave it "
        "more memory bandwidth and clock); wall/(alone/cp): the ratio against it, for reference");
    if (rank == 0) {
      std::fputs(per_rank.format().c_str(), stdout);
      std::fputs("\n", stdout);
      std::fputs(summary.format().c_str(), stdout);
      std::fputs("\n", stdout);
      std::fputs(kinds.format().c_str(), stdout);
      std::printf("# wrong rows in total: %lld (%s)\n", total_wrong, total_wrong ? "FAILED" : "OK");
      std::fflush(stdout);
      if (!output_.empty()) write_bench_file(output_, {per_rank, summary, kinds, step_table}, command_line());
    }
    world.barrier();
    if (gate && rank == 0) ::unlink(gate_path.c_str());
    return total_wrong ? 1 : 0;
  }

 private:
  std::string seq_per_rank_ = "1024,2048";
  std::string layout_ = "both";
  bool causal_ = false;
  bool baseline_ = false;
  bool serialize_ = false;
  int heads_ = 2;
  int kv_heads_ = 0;
  int head_dim_ = 64;
  int iters_ = 1;
  int threads_ = 1;
  double timeout_s_ = 600;
  std::string output_;
};

}  // namespace

std::unique_ptr<Command> add_bench_ring(CLI::App& parent) {
  auto* app =
      parent.add_subcommand("ring", "Ring attention balance and overlap per rank (mpirun)");
  return std::make_unique<BenchRingCommand>(app);
}
}  // namespace trident::cli
