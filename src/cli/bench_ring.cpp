// `trident bench ring`: ring attention over all ranks of the job (cp = world
// size), forward + backward, for each layout and local sequence length.
// With --cp-mode naming ulysses or hybrid, the modes side by side instead
// (bench_cp_modes.cpp); the tables below are the ring's alone.
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
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <sstream>

#include "bench_cp_modes.hpp"
#include "bench_harness.hpp"
#include "bench_ring_docs.hpp"
#include "commands.hpp"
#include "list_flags.hpp"
#include "trident/comm/backend.hpp"
#include "trident/comm/comm.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"
#include "trident/core/profiler.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/parallel/cp/ring_attention.hpp"

namespace trident::cli {
namespace {

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

// The shapes every case shares.
struct Heads {
  int H, Hkv, D;
};

// One sequence's attention inputs and outputs at the given positions.
struct AttentionData {
  AttentionData(const std::vector<int64_t>& pos, const Heads& h) {
    q = rows_at(pos, int64_t(h.H) * h.D, "ring.q"),
    k = rows_at(pos, int64_t(h.Hkv) * h.D, "ring.k");
    v = rows_at(pos, int64_t(h.Hkv) * h.D, "ring.v"),
    dout = rows_at(pos, int64_t(h.H) * h.D, "ring.do");
    out.resize(q.size()), lse.resize(pos.size() * size_t(h.H)), dq.resize(q.size());
    dk.resize(k.size()), dv.resize(v.size());
  }
  // Forward then backward through ring.
  void run(cp::RingAttention& ring, const Heads& h) {
    ring.forward(q.data(), k.data(), v.data(), h.H, h.Hkv, h.D, out.data(), lse.data());
    ring.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), h.H, h.Hkv,
                  h.D, dq.data(), dk.data(), dv.data());
  }
  std::vector<float> q, k, v, dout, out, lse, dq, dk, dv;
};

// The one-rank reference: forward+backward over the whole sequence with no
// ring. Inputs are allocated on first use (ranks that never run it hold none).
class OneRankJob {
 public:
  OneRankJob(int64_t seq, const Heads& h, bool causal)
      : seq_(seq), h_(h), one_(nullptr, cp::Layout::contiguous, causal, seq) {}

  // One iteration after a barrier of `world` (with run_here on every rank,
  // they run at the same time). Seconds, or NaN where it did not run.
  double iterate(Communicator& world, bool run_here) {
    world.barrier();
    if (!run_here) return NAN;
    if (!data_) data_ = std::make_unique<AttentionData>(all_positions(seq_), h_);
    const double t0 = now_s();
    data_->run(one_, h_);
    return now_s() - t0;
  }

 private:
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
  LayoutCase(Communicator* comm, cp::Layout l, bool causal, int64_t seq, const Heads& heads,
             ComputeLock* lock)
      : layout(l), ring(comm, l, causal, seq), h(heads), data(ring.positions(), heads), work(lock) {
    ring.set_profiler(&work);
  }

  // One forward+backward after a barrier; appends this rank's measurements.
  void iterate(Communicator& world) {
    work.clear();
    world.barrier();
    const double t0 = now_s(), c0 = cpu_seconds_now();
    data.run(ring, h);
    walls.push_back(now_s() - t0);
    cpus.push_back(cpu_seconds_now() - c0);
    computes.push_back(work.compute_s());
    compute_cpus.push_back(work.counter("ring.compute_cpu_s"));
    progresses.push_back(work.counter("ring.progress_s"));
    waits.push_back(work.seconds("ring.wait"));
    const auto s = work.step_compute_s(ring.cp_size());
    steps.insert(steps.end(), s.begin(), s.end());
  }

  // Two local rows of head 0 against the fp64 definition over the whole
  // sequence: the worst relative error, and the rows off by more than 1e-4.
  void spot_check(int64_t seq, bool causal, double* worst, double* wrong) const {
    const int H = h.H, Hkv = h.Hkv, D = h.D;
    const auto all = all_positions(seq);
    auto gk = rows_at(all, int64_t(Hkv) * D, "ring.k"),
         gv = rows_at(all, int64_t(Hkv) * D, "ring.v");
    kernels::AttnShape s{1, seq, H, Hkv, D, 1.0f / std::sqrt(float(D)), causal, 0, 0};
    std::vector<double> ref(static_cast<size_t>(D));
    const auto& pos = ring.positions();
    const int64_t T = int64_t(pos.size());
    for (int64_t i : {int64_t(0), T - 1}) {
      s.q_pos0 = pos[size_t(i)];
      kernels::attention_reference_row(s, data.q.data() + i * H * D, gk.data(), gv.data(), 0, 0,
                                       ref.data());
      double num = 0, den = 0;
      for (int d = 0; d < D; ++d) {
        const double diff = data.out[size_t(i * H * D + d)] - ref[size_t(d)];
        num += diff * diff, den += ref[size_t(d)] * ref[size_t(d)];
      }
      const double err = std::sqrt(num / std::max(den, 1e-30));
      *worst = std::max(*worst, err);
      if (!(err <= 1e-4)) *wrong += 1;
    }
  }

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
std::vector<double> gather_stats(Communicator& world, const LayoutCase& lc, int64_t seq,
                                 bool causal) {
  double stats[kNumStats] = {};
  lc.spot_check(seq, causal, &stats[kErr], &stats[kWrong]);
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

class BenchRingCommand : public Command {
 public:
  explicit BenchRingCommand(CLI::App* app) {
    app->add_option("--seq-per-rank", seq_per_rank_, "Local tokens per rank, comma-separated");
    app->add_option(
        "--layout", layout_,
        "zigzag, contiguous or both (default); with --docs also docs, all (default) or a "
        "comma-separated list");
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
    app->add_option("--cp-mode", cp_mode_,
                    "ring, ulysses, hybrid, or a comma-separated list of them: with ulysses or "
                    "hybrid in it, the modes are timed side by side (time, bytes per rank, "
                    "share of communication hidden)");
    app->add_option("--ulysses", ulysses_, "hybrid: Ulysses (all-to-all) group size u");
    app->add_option("--docs", docs_,
                    "Packed documents against full causal at equal tokens: document lengths "
                    "from lognormal[:MEAN[:SIGMA]] (default mean seq/8, sigma 1) or fixed:LEN");
    app->add_option("--docs-seed", docs_seed_, "--docs: seed of the document lengths");
    app->add_option("--docs-seeds", docs_seeds_,
                    "--docs: run this many seeds from --docs-seed on (the causal ring once) and "
                    "summarise them per layout");
    app->add_flag("--per-rank", per_rank_,
                  "--docs: also list every rank's modelled tile work next to its compute");
    app->add_option("--window", window_, "--docs: sliding window of both rings (0: off)");
  }

  bool needs_mpi() const override { return true; }
  int run() override;

 private:
  std::vector<cp::Layout> check_flags();
  void check_docs_flags(const std::vector<CpMode>& modes) const;
  RingDocsOptions docs_options() const;
  void measure(Communicator& world, Communicator& ring_comm, int64_t T, ComputeLock* lock);
  void add_case_rows(Communicator& world, LayoutCase& lc, int64_t T, const Baseline& base);
  void report(int rank) const;

  std::string seq_per_rank_ = "1024,2048";
  std::string layout_;  // "": both, or all with --docs
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
  std::string cp_mode_ = "ring";
  int ulysses_ = 2;
  std::string docs_;
  uint64_t docs_seed_ = 1;
  int docs_seeds_ = 1;
  bool per_rank_ = false;
  int64_t window_ = 0;
  // Filled by run().
  std::vector<cp::Layout> layouts_;
  Heads h_{};
  RingTables tables_;
  long long total_wrong_ = 0;
};

std::vector<cp::Layout> BenchRingCommand::check_flags() {
  std::vector<cp::Layout> layouts;
  // --docs compares all three layouts unless told otherwise; "docs" needs
  // documents to lay out.
  const std::string which = layout_.empty() ? (docs_.empty() ? "both" : "all") : layout_;
  if (which == "both")
    layouts = {cp::Layout::contiguous, cp::Layout::zigzag};
  else if (which == "all" && !docs_.empty())
    layouts = {cp::Layout::contiguous, cp::Layout::zigzag, cp::Layout::docs};
  else if (which == "zigzag" || which == "contiguous" || (which == "docs" && !docs_.empty()))
    layouts = {cp::parse_layout(which)};
  else if (!docs_.empty() && which.find(',') != std::string::npos) {
    std::stringstream list(which);
    for (std::string name; std::getline(list, name, ',');) {
      if (name != "zigzag" && name != "contiguous" && name != "docs")
        throw InputError("--layout " + which + ": '" + name +
                         "' is not zigzag, contiguous or docs");
      layouts.push_back(cp::parse_layout(name));
    }
  } else
    throw InputError("--layout " + which +
                     ": must be zigzag, contiguous or both (with --docs also docs, all, or a "
                     "comma-separated list of them)");
  if (kv_heads_ == 0) kv_heads_ = heads_;
  if (heads_ < 1 || kv_heads_ < 1 || heads_ % kv_heads_ != 0)
    throw InputError("--heads " + std::to_string(heads_) + " --kv-heads " +
                     std::to_string(kv_heads_) + ": heads must be a positive multiple of kv-heads");
  if (head_dim_ < 1) throw InputError("--head-dim " + std::to_string(head_dim_) + ": must be >= 1");
  if (iters_ < 1) throw InputError("--iters " + std::to_string(iters_) + ": must be >= 1");
  if (threads_ < 1) throw InputError("--threads " + std::to_string(threads_) + ": must be >= 1");
  if (!(timeout_s_ > 0)) throw InputError("--timeout: must be > 0");
  for (int64_t t : parse_positive_list("--seq-per-rank", seq_per_rank_))
    if (t % 2 != 0)
      throw InputError("--seq-per-rank " + seq_per_rank_ + ": " + std::to_string(t) +
                       " is odd (a zig-zag rank holds two equal chunks)");
  return layouts;
}

// One local sequence length: every iteration runs the one-rank reference of
// the whole sequence (alone on rank 0 while the others wait, then on every
// rank at once) and then each layout's ring, back to back, so that each ring
// iteration has its own baseline taken moments before it.
void BenchRingCommand::measure(Communicator& world, Communicator& ring_comm, int64_t T,
                               ComputeLock* lock) {
  const int cp = world.size();
  const int64_t seq = T * cp;
  std::vector<std::unique_ptr<LayoutCase>> cases;
  for (cp::Layout layout : layouts_) {
    cp::check_layout(seq, cp, layout);
    cases.push_back(std::make_unique<LayoutCase>(&ring_comm, layout, causal_, seq, h_, lock));
  }
  std::unique_ptr<OneRankJob> one;
  if (baseline_) one = std::make_unique<OneRankJob>(seq, h_, causal_);
  std::vector<double> alone, busy;  // per iteration: rank 0's; this rank's
  for (int it = 0; it < iters_; ++it) {
    if (one) {
      alone.push_back(one->iterate(world, world.rank() == 0));
      busy.push_back(one->iterate(world, true));
    }
    for (auto& lc : cases) lc->iterate(world);
  }
  const Baseline base = baseline_per_iteration(world, alone, busy, iters_);
  for (auto& lc : cases) {
    add_case_rows(world, *lc, T, base);
    if (world.rank() == 0)
      std::fprintf(stderr, "  done: %s seq/cp %lld\n", cp::layout_name(lc->layout),
                   static_cast<long long>(T));
  }
}

// One case's rows: per rank, per step kind, per step (HDF5 only) and the summary.
void BenchRingCommand::add_case_rows(Communicator& world, LayoutCase& lc, int64_t T,
                                     const Baseline& base) {
  const int cp = world.size();
  const int64_t seq = T * cp;
  const std::string layout = cp::layout_name(lc.layout);
  // The ring's wall time of an iteration is its slowest rank's.
  const std::vector<double> iter_walls = gather_series(world, lc.walls).slowest_per_iteration();
  const RankSeries steps = gather_series(world, lc.steps);
  const auto rel = paired_relative_cost(steps.values, cp, iters_, 2 * cp);
  if (world.rank() == 0) {
    add_kind_rows(tables_.kinds, causal_, lc.layout, seq, cp, iters_, steps.values);
    add_step_rows(tables_.steps, lc.layout, seq, cp, iters_, steps.values);
  }
  const std::vector<double> all = gather_stats(world, lc, seq, causal_);
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
    total_wrong_ += static_cast<long long>(st[kWrong]);
    tables_.per_rank.add_row(
        {layout, static_cast<long long>(seq), static_cast<long long>(T), static_cast<long long>(r),
         st[kFlops] / 1e9, st[kCompute] * 1e3, rel[size_t(r)], st[kProgress] * 1e3, st[kWait] * 1e3,
         st[kWall] * 1e3, st[kCpu] * 1e3, st[kCompute] / st[kWall], st[kFlops] / st[kCompute] / 1e9,
         st[kWorkspace] / 1048576.0, st[kBytes] / 1048576.0, st[kErr],
         static_cast<long long>(st[kWrong])});
  }
  const bool ref = baseline_;
  tables_.summary.add_row(
      {layout, static_cast<long long>(seq), static_cast<long long>(T), cmax / cmin, pmax / pmin,
       umax / umin, fmax / fmin, omin, median(iter_walls) * 1e3,
       ref ? median(base.busy) * 1e3 : NAN, ref ? ratio_to_share(iter_walls, base.busy, cp) : NAN,
       ref ? median(base.alone) * 1e3 : NAN, ref ? ratio_to_share(iter_walls, base.alone, cp) : NAN,
       wsmax / 1048576.0});
}

void BenchRingCommand::report(int rank) const {
  if (rank != 0) return;
  std::fputs(tables_.per_rank.format().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fputs(tables_.summary.format().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fputs(tables_.kinds.format().c_str(), stdout);
  std::printf("# wrong rows in total: %lld (%s)\n", total_wrong_, total_wrong_ ? "FAILED" : "OK");
  std::fflush(stdout);
  if (!output_.empty())
    write_bench_file(output_, {tables_.per_rank, tables_.summary, tables_.kinds, tables_.steps},
                     command_line());
}

// The --docs flags, before any rank starts.
void BenchRingCommand::check_docs_flags(const std::vector<CpMode>& modes) const {
  if (!docs_.empty() && (modes != std::vector<CpMode>{CpMode::ring} || baseline_ || serialize_))
    throw InputError(
        "--docs: runs the ring alone, without --cp-mode, --baseline and "
        "--serialize-compute");
  if (window_ < 0) throw InputError("--window " + std::to_string(window_) + ": must be >= 0");
  if (window_ > 0 && docs_.empty()) throw InputError("--window: only with --docs");
  if (docs_seeds_ < 1)
    throw InputError("--docs-seeds " + std::to_string(docs_seeds_) + ": must be >= 1");
  if ((docs_seeds_ > 1 || per_rank_) && docs_.empty())
    throw InputError(std::string(per_rank_ ? "--per-rank" : "--docs-seeds") + ": only with --docs");
  if (!docs_.empty())  // the lengths' syntax
    document_lengths(docs_, 1, docs_seed_);
}

RingDocsOptions BenchRingCommand::docs_options() const {
  RingDocsOptions o;
  o.dist = docs_;
  o.seed = docs_seed_;
  o.seeds = docs_seeds_;
  o.per_rank = per_rank_;
  o.window = window_;
  o.layouts = layouts_;
  o.seq_per_rank = parse_positive_list("--seq-per-rank", seq_per_rank_);
  o.heads = heads_, o.kv_heads = kv_heads_, o.head_dim = head_dim_, o.iters = iters_;
  o.output = output_;
  return o;
}

int BenchRingCommand::run() {
  layouts_ = check_flags();
  std::vector<CpMode> modes;
  for (const std::string& name : split_list("--cp-mode", cp_mode_)) {
    const auto m = parse_config_name<CpMode>(name);
    if (!m)
      throw InputError("--cp-mode " + cp_mode_ + ": '" + name +
                       "' is not one of ring, ulysses, hybrid");
    modes.push_back(*m);
  }
  if (modes.empty()) throw InputError("--cp-mode: names no mode");
  kernels::set_blas_threads(threads_);

  check_docs_flags(modes);
  auto job = world_communicator(timeout_s_);
  auto ring_group =
      comm_group(*job, CommBackend::mpi, 0, job->rank(), CommKind::cp, "cp", timeout_s_);
  Communicator &ring_comm = *ring_group, &world = *job;
  if (!docs_.empty()) {
    const long long wrong = run_ring_docs(ring_comm, docs_options());
    world.barrier();
    return wrong ? 1 : 0;
  }
  if (modes != std::vector<CpMode>{CpMode::ring}) {
    if (baseline_ || serialize_)
      throw InputError("--cp-mode " + cp_mode_ +
                       ": --baseline and --serialize-compute belong to the ring's own tables");
    CpModesOptions o;
    o.modes = modes;
    o.ulysses = ulysses_;
    o.layouts = layouts_;
    o.seq_per_rank = parse_positive_list("--seq-per-rank", seq_per_rank_);
    o.causal = causal_;
    o.heads = heads_, o.kv_heads = kv_heads_, o.head_dim = head_dim_, o.iters = iters_;
    o.output = output_;
    const long long wrong = run_cp_modes(ring_comm, o);
    world.barrier();
    return wrong ? 1 : 0;
  }
  const int cp = world.size(), rank = world.rank();
  h_ = Heads{heads_, kv_heads_, head_dim_};
  // --serialize-compute: one lock file for the job, named by rank 0.
  std::unique_ptr<ComputeLock> lock;
  std::string lock_path;
  if (serialize_) {
    char name[128] = {};
    if (rank == 0)
      std::snprintf(name, sizeof name, "/tmp/trident-ring-compute-%d.lock", int(getpid()));
    world.broadcast(name, sizeof name, 0);
    lock_path = name;
    lock = std::make_unique<ComputeLock>(lock_path, timeout_s_);
  }
  tables_ = make_tables(cp, causal_, h_, iters_, serialize_);
  for (int64_t T : parse_positive_list("--seq-per-rank", seq_per_rank_))
    measure(world, ring_comm, T, lock.get());
  report(rank);
  world.barrier();
  if (lock && rank == 0) ::unlink(lock_path.c_str());
  return total_wrong_ ? 1 : 0;
}

}  // namespace

std::unique_ptr<Command> add_bench_ring(CLI::App& parent) {
  auto* app = parent.add_subcommand("ring", "Ring attention balance and overlap per rank (mpirun)");
  return std::make_unique<BenchRingCommand>(app);
}
}  // namespace trident::cli
