// `trident bench ring`: ring attention over all ranks of the job (cp = world
// size), forward + backward, for each layout and local sequence length.
//
// Per rank: attention FLOPs, compute time, time blocked on the ring, wall
// time, overlap efficiency (compute / wall) and peak attention workspace.
// Per case: balance (max/min per-rank compute time and FLOPs) and, with
// --baseline, the one-rank time of the whole sequence on rank 0 so that the
// ring's wall time can be compared with an ideal 1/cp share of it.
//
// Every rank spot-checks a few of its output rows against the fp64
// definition over the whole sequence (inputs are regenerable from their
// global positions); rows off by more than 1e-4 count in #wrong and make the
// exit code 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "commands.hpp"
#include "list_flags.hpp"
#include "trident/comm/comm.hpp"
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

std::vector<int64_t> all_positions(int64_t seq) {
  std::vector<int64_t> p(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) p[size_t(i)] = i;
  return p;
}


// What each rank reports for one case (gathered to rank 0 as doubles).
enum Stat { kFlops, kCompute, kWait, kWall, kWorkspace, kBytes, kErr, kWrong, kNumStats };

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
                  "Also time the whole sequence on rank 0 alone (one-rank reference)");
    app->add_option("--threads", threads_, "BLAS threads per rank");
    app->add_option("--timeout", timeout_s_, "Deadline of any single wait, seconds");
    app->add_option("--output", output_, "Write the tables to this HDF5 file");
  }

  bool needs_mpi() const override { return true; }

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

    MPI_Comm ring_mpi;
    MPI_Comm_dup(MPI_COMM_WORLD, &ring_mpi);
    Communicator ring_comm(ring_mpi, CommKind::cp, "cp", timeout_s_, true);
    Communicator world(MPI_COMM_WORLD, CommKind::world, "world", timeout_s_, false);
    const int cp = world.size(), rank = world.rank();
    const int H = heads_, Hkv = kv_heads_, D = head_dim_;

    BenchTable per_rank, summary;
    per_rank.name = "ring_ranks";
    per_rank.title = "Ring attention per rank: cp=" + std::to_string(cp) + ", " +
                     (causal_ ? "causal" : "full") + ", heads " + std::to_string(H) + "/" +
                     std::to_string(Hkv) + ", head_dim " + std::to_string(D) + ", forward+backward";
    per_rank.columns = {"layout",  "seq",        "seq/cp",     "rank",          "GFLOP",
                        "compute_ms", "wait_ms", "wall_ms",    "overlap",       "GFLOP/s",
                        "workspace_MiB", "sent_MiB", "max_err", "#wrong"};
    summary.name = "ring";
    summary.title = "Ring attention per case: cp=" + std::to_string(cp) + ", " +
                    (causal_ ? "causal" : "full") + ", mean of " + std::to_string(iters_) +
                    " iteration(s)";
    summary.columns = {"layout",       "seq",          "seq/cp",       "balance_compute",
                       "balance_flops", "overlap_min", "wall_ms",      "one_rank_ms",
                       "wall/(one_rank/cp)", "workspace_MiB_max"};

    long long total_wrong = 0;
    for (int64_t T : seqs) {
      const int64_t seq = T * cp;
      // The one-rank time of the whole sequence (rank 0; the others wait).
      double one_rank_s = NAN;
      if (baseline_) {
        world.barrier();
        if (rank == 0) {
          const auto all = all_positions(seq);
          auto q = rows_at(all, int64_t(H) * D, "ring.q"), k = rows_at(all, int64_t(Hkv) * D, "ring.k");
          auto v = rows_at(all, int64_t(Hkv) * D, "ring.v"), dout = rows_at(all, int64_t(H) * D, "ring.do");
          std::vector<float> out(q.size()), lse(size_t(seq * H)), dq(q.size()), dk(k.size()),
              dv(v.size());
          cp::RingAttention one(nullptr, cp::Layout::contiguous, causal_, seq);
          const double t0 = seconds_now();
          for (int it = 0; it < iters_; ++it) {
            one.forward(q.data(), k.data(), v.data(), H, Hkv, D, out.data(), lse.data());
            one.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), H,
                         Hkv, D, dq.data(), dk.data(), dv.data());
          }
          one_rank_s = (seconds_now() - t0) / iters_;
        }
        world.broadcast(&one_rank_s, sizeof one_rank_s, 0);
      }

      for (cp::Layout layout : layouts) {
        cp::check_layout(seq, cp, layout);
        cp::RingAttention ring(&ring_comm, layout, causal_, seq);
        const auto& pos = ring.positions();
        auto q = rows_at(pos, int64_t(H) * D, "ring.q"), k = rows_at(pos, int64_t(Hkv) * D, "ring.k");
        auto v = rows_at(pos, int64_t(Hkv) * D, "ring.v"), dout = rows_at(pos, int64_t(H) * D, "ring.do");
        std::vector<float> out(q.size()), lse(size_t(T * H)), dq(q.size()), dk(k.size()),
            dv(v.size());
        world.barrier();
        const double t0 = seconds_now();
        for (int it = 0; it < iters_; ++it) {
          ring.forward(q.data(), k.data(), v.data(), H, Hkv, D, out.data(), lse.data());
          ring.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), H, Hkv,
                        D, dq.data(), dk.data(), dv.data());
        }
        const double wall = (seconds_now() - t0) / iters_;

        // Spot check: two local rows per head 0 against the whole sequence.
        double stats[kNumStats] = {};
        {
          const auto all = all_positions(seq);
          auto gk = rows_at(all, int64_t(Hkv) * D, "ring.k"), gv = rows_at(all, int64_t(Hkv) * D, "ring.v");
          kernels::AttnShape s{1, seq, H, Hkv, D, 1.0f / std::sqrt(float(D)), causal_, 0, 0};
          std::vector<double> ref(static_cast<size_t>(D));
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
            stats[kErr] = std::max(stats[kErr], err);
            if (!(err <= 1e-4)) stats[kWrong] += 1;
          }
        }
        const cp::RingCounters& c = ring.counters();
        stats[kFlops] = c.flops / iters_;
        stats[kCompute] = c.compute_s / iters_;
        stats[kWait] = c.wait_s / iters_;
        stats[kWall] = wall;
        stats[kWorkspace] = double(c.peak_workspace_bytes);
        stats[kBytes] = c.bytes_sent / iters_;
        std::vector<double> all_stats(size_t(kNumStats) * cp);
        world.allgather(stats, all_stats.data(), sizeof stats);

        double cmax = 0, cmin = 1e300, fmax = 0, fmin = 1e300, omin = 1e300, wmax = 0, wsmax = 0;
        for (int r = 0; r < cp; ++r) {
          const double* st = all_stats.data() + size_t(r) * kNumStats;
          cmax = std::max(cmax, st[kCompute]), cmin = std::min(cmin, st[kCompute]);
          fmax = std::max(fmax, st[kFlops]), fmin = std::min(fmin, st[kFlops]);
          omin = std::min(omin, st[kCompute] / st[kWall]);
          wmax = std::max(wmax, st[kWall]), wsmax = std::max(wsmax, st[kWorkspace]);
          total_wrong += static_cast<long long>(st[kWrong]);
          per_rank.add_row({std::string(cp::layout_name(layout)), static_cast<long long>(seq),
                            static_cast<long long>(T), static_cast<long long>(r),
                            st[kFlops] / 1e9, st[kCompute] * 1e3, st[kWait] * 1e3,
                            st[kWall] * 1e3, st[kCompute] / st[kWall],
                            st[kFlops] / st[kCompute] / 1e9, st[kWorkspace] / 1048576.0,
                            st[kBytes] / 1048576.0, st[kErr],
                            static_cast<long long>(st[kWrong])});
        }
        summary.add_row({std::string(cp::layout_name(layout)), static_cast<long long>(seq),
                         static_cast<long long>(T), cmax / cmin, fmax / fmin, omin, wmax * 1e3,
                         one_rank_s * 1e3, wmax / (one_rank_s / cp), wsmax / 1048576.0});
        if (rank == 0)
          std::fprintf(stderr, "  done: %s seq/cp %lld\n", cp::layout_name(layout),
                       static_cast<long long>(T));
      }
    }
    per_rank.notes.push_back(
        "compute: time in the attention kernels and LSE merges; wait: blocked on ring transfers "
        "(K/V ahead, dK/dV behind); overlap = compute / wall");
    per_rank.notes.push_back(
        "GFLOP: attention FLOPs of the rank (forward 4*D, backward 10*D per visible pair and "
        "head); workspace: peak scratch of one call (K/V double buffer, partial output, dK/dV "
        "buffers, kernel tiles)");
    summary.notes.push_back("balance_*: max/min over ranks; wall/(one_rank/cp): ring wall time "
                            "over an ideal 1/cp share of the one-rank time (needs --baseline)");
    if (rank == 0) {
      std::fputs(per_rank.format().c_str(), stdout);
      std::fputs("\n", stdout);
      std::fputs(summary.format().c_str(), stdout);
      std::printf("# wrong rows in total: %lld (%s)\n", total_wrong, total_wrong ? "FAILED" : "OK");
      std::fflush(stdout);
      if (!output_.empty()) write_bench_file(output_, {per_rank, summary}, command_line());
    }
    world.barrier();
    return total_wrong ? 1 : 0;
  }

 private:
  std::string seq_per_rank_ = "1024,2048";
  std::string layout_ = "both";
  bool causal_ = false;
  bool baseline_ = false;
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
