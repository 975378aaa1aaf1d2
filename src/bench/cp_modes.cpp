// The context-parallel modes side by side (`trident bench ring --cp-mode
// ring,ulysses,hybrid`): for each local sequence length and layout, every
// mode runs the same sequence's attention forward + backward on all ranks of
// the job (cp = world size), back to back within an iteration.
//
// Per case: wall time (slowest rank), kernel time (and its CPU time, which
// waiting for a core does not inflate), the Ulysses all-to-alls' time, time
// blocked on the ring, bytes each rank sent, and the share of communication
// hidden behind compute:
//   exposed = all-to-all time + ring wait   (communication not overlapped)
//   alone   = all-to-all time + the ring's transfers run on their own
//   hidden  = 1 - exposed / alone           (clipped to [0, 1])
// "The ring's transfers on their own" replays the ring's messages (r-1 K/V
// blocks forward; r-1 K/V and r dK/dV blocks backward, each of the sizes
// the ring reported) one after another with no compute in between. The
// all-to-alls have nothing to overlap with, so they count whole in both.
//
// The job comes from the config (bench::open_job): the modes run on
// runtime.comm's backend with their buffers on the rank's device.
//
// Every rank spot-checks two of its output rows of head 0 against the fp64
// definition over the whole sequence; rows off by more than 1e-4 count in
// #wrong (and make the exit code 1).
#include "trident/bench/cp_modes.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "trident/bench/engine.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/clock.hpp"
#include "trident/core/error.hpp"
#include "trident/core/profiler.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/kernels/types/attention.hpp"
#include "trident/parallel/cp/config_rules.hpp"
#include "trident/parallel/cp/ring_attention.hpp"
#include "trident/parallel/cp/ulysses_attention.hpp"

namespace trident::bench {
namespace {

constexpr int kTagReplay = 3201;

// One mode's attention on this rank's shard, its buffers on ctx's device.
class ModeCase {
 public:
  // group: every rank of the job on runtime.comm's backend (the attention's
  // communicator).
  ModeCase(Communicator& group, const kernels::Ctx& ctx, CpMode mode, int u, CpLayout layout,
           int64_t seq, const CpModesOptions& o)
      : mode_(mode), u_(mode == CpMode::ring ? 1 : u), opt_(o), ctx_(ctx) {
    if (mode == CpMode::ring) {
      ring_ = std::make_unique<cp::RingAttention>(&group, layout, o.causal, seq, ctx);
      ring_->set_profiler(&work_);
      positions_ = ring_->positions();
    } else {
      uly_ = std::make_unique<cp::UlyssesAttention>(&group, u_, layout, o.causal, seq, o.heads,
                                                    o.kv_heads, o.head_dim, ctx);
      uly_->set_profiler(&work_);
      positions_ = uly_->positions();
    }
    // The ring of the replay: same members as the attention's ring.
    const int r = group.rank();
    replay_ = group.split(r % u_, r / u_, CommKind::cp, "cp_replay");
    t_ = AttentionTensors(ctx, positions_, o.heads, o.kv_heads, o.head_dim);
  }

  // One forward + backward after a barrier of world (MPI's), then the
  // ring's replay.
  void iterate(Communicator& world) {
    work_.clear();
    world.barrier();
    const double t0 = device_now_s(ctx_);
    if (ring_) {
      ring_->forward(t_.q, t_.k, t_.v, opt_.heads, opt_.kv_heads, opt_.head_dim, t_.out, t_.lse);
      ring_->backward(t_.q, t_.k, t_.v, t_.out, t_.lse, t_.dout, opt_.heads, opt_.kv_heads,
                      opt_.head_dim, t_.dq, t_.dk, t_.dv);
    } else {
      uly_->forward(t_.q, t_.k, t_.v, t_.out, t_.lse);
      uly_->backward(t_.q, t_.k, t_.v, t_.out, t_.lse, t_.dout, t_.dq, t_.dk, t_.dv);
    }
    wall.push_back(device_now_s(ctx_) - t0);
    compute.push_back(work_.seconds("ring.forward") + work_.seconds("ring.backward"));
    compute_cpu.push_back(work_.counter("ring.compute_cpu_s"));
    a2a.push_back(work_.seconds("ulysses.alltoall"));
    wait.push_back(work_.seconds("ring.wait") + work_.counter("ring.progress_s"));
    bytes = work_.counter("ring.bytes_sent") + work_.counter("ulysses.bytes_sent");
    world.barrier();
    ring_alone.push_back(replay_ring(work_.counter("ring.bytes_sent")));
  }

  // Two local rows of head 0 against the fp64 definition.
  void spot_check(int64_t seq, double* worst, double* wrong) const {
    const int D = opt_.head_dim;
    const kernels::AttnShape s{
        1, seq, opt_.heads, opt_.kv_heads, D, 1.0f / std::sqrt(float(D)), opt_.causal, 0, 0};
    SpotCheck check;
    check_sharded_rows(check, ctx_, s, positions_, {0, int64_t(positions_.size()) - 1}, t_.out,
                       "ring.q", "ring.k", "ring.v");
    *worst = std::max(*worst, check.worst);
    *wrong += double(check.wrong);
  }

  CpMode mode() const { return mode_; }
  int ulysses() const { return u_; }
  std::vector<double> wall, compute, compute_cpu, a2a, wait, ring_alone;
  double bytes = 0;

 private:
  // The ring's messages of one forward + backward, one after another without
  // compute: 3r-2 blocks of equal size (RingAttention's count), seconds. The
  // blocks are on the device, as the ring's are; each step's send and
  // receive start together (a device backend needs both posted at once).
  double replay_ring(double ring_bytes) {
    const int r = replay_->size();
    if (r == 1 || ring_bytes == 0) return 0;
    const size_t block = size_t(ring_bytes / (3 * r - 2));
    const int64_t floats = int64_t((block + sizeof(float) - 1) / sizeof(float));
    if (send_buf_.numel() < floats)
      send_buf_ = kernels::zeros(ctx_, {floats}), recv_buf_ = kernels::zeros(ctx_, {floats});
    const int next = (replay_->rank() + 1) % r, prev = (replay_->rank() - 1 + r) % r;
    const double t0 = device_now_s(ctx_);
    for (int m = 0; m < 3 * r - 2; ++m) {
      replay_->begin_group();
      Request rr = replay_->irecv(recv_buf_.data_ptr(), block, prev, kTagReplay);
      Request sr = replay_->isend(send_buf_.data_ptr(), block, next, kTagReplay);
      replay_->end_group();
      replay_->wait(rr);
      replay_->wait(sr);
    }
    return device_now_s(ctx_) - t0;
  }

  CpMode mode_;
  int u_;
  const CpModesOptions& opt_;
  const kernels::Ctx& ctx_;
  std::unique_ptr<cp::RingAttention> ring_;
  std::unique_ptr<cp::UlyssesAttention> uly_;
  std::unique_ptr<Communicator> replay_;
  prof::Recorder work_{false};
  std::vector<int64_t> positions_;
  AttentionTensors t_;
  Tensor send_buf_, recv_buf_;
};

BenchTable make_table(const CpModesOptions& o, int cp) {
  TableSpec t{
      "cp_modes",
      "Context-parallel modes: cp=" + std::to_string(cp) + ", " + (o.causal ? "causal" : "full") +
          ", heads " + std::to_string(o.heads) + "/" + std::to_string(o.kv_heads) + ", head_dim " +
          std::to_string(o.head_dim) + ", forward+backward, median of " + std::to_string(o.iters) +
          " iteration(s)",
      {"mode", "u", "ring", "layout", "seq", "seq/cp", "wall_ms", "compute_ms", "compute_cpu_ms",
       "a2a_ms", "ring_wait_ms", "exposed_ms", "comm_alone_ms", "hidden", "sent_MiB/rank",
       "max_err", "#wrong"},
      {"u: Ulysses (all-to-all) group size; ring: ranks of the ring (cp/u). wall: slowest "
       "rank's forward+backward from a barrier; compute: attention kernels (compute_cpu: their "
       "CPU time, not inflated by waiting for a core); a2a: the Ulysses all-to-alls with their "
       "packing; ring_wait: blocked on, or driving, ring transfers; exposed = a2a + "
       "ring_wait; comm_alone = a2a + the ring's messages replayed without "
       "compute; hidden = 1 - exposed/comm_alone, clipped to [0, 1]. Per-rank medians over "
       "iterations, then the mean over ranks (wall: median of the slowest rank)",
       "sent_MiB/rank: bytes one rank sends to others in one forward+backward (ring K/V and "
       "dK/dV blocks, all-to-all blocks), the largest over ranks"}};
  return t.make();
}

// The modes' flags against this cp (before any rank communicates).
void check_modes(const CpModesOptions& o, int cp) {
  for (CpMode m : o.modes) {
    if (m == CpMode::ring) continue;
    const int u = m == CpMode::ulysses ? cp : o.ulysses;
    if (m == CpMode::hybrid && (u < 2 || u >= cp || cp % u != 0))
      throw InputError("--ulysses " + std::to_string(o.ulysses) +
                       ": hybrid needs 1 < u < cp=" + std::to_string(cp) + " dividing cp");
    const std::string broken = cp::heads_rule_broken(o.heads, o.kv_heads, u);
    if (!broken.empty())
      throw InputError("--heads " + std::to_string(o.heads) + " --kv-heads " +
                       std::to_string(o.kv_heads) + ": " + broken);
  }
}

// One mode's row of the table from every rank's medians; returns its wrong rows.
long long add_mode_row(Communicator& world, ModeCase& c, CpLayout layout, int64_t T,
                       BenchTable& table) {
  const int cp = world.size();
  const int64_t seq = T * cp;
  double st[9] = {
      median(c.compute), median(c.a2a),  median(c.wait),       median(c.ring_alone), 0, 0,
      c.bytes,           median(c.wall), median(c.compute_cpu)};
  c.spot_check(seq, &st[4], &st[5]);
  std::vector<double> all(size_t(9) * size_t(cp));
  world.allgather(st, all.data(), sizeof st);
  const double wall = median(gather_series(world, c.wall).slowest_per_iteration());
  double compute = 0, a2a = 0, wait = 0, alone = 0, err = 0, wrong = 0, bytes = 0, cpu = 0;
  for (int r = 0; r < cp; ++r) {
    const double* s = all.data() + 9 * size_t(r);
    compute += s[0] / cp, a2a += s[1] / cp, wait += s[2] / cp, cpu += s[8] / cp;
    alone += (s[1] + s[3]) / cp;
    err = std::max(err, s[4]), wrong += s[5], bytes = std::max(bytes, s[6]);
  }
  const double exposed = a2a + wait;
  const double hidden = alone > 0 ? std::clamp(1 - exposed / alone, 0.0, 1.0) : NAN;
  table.add_row({std::string(config_name(c.mode())), (long long)c.ulysses(),
                 (long long)(cp / c.ulysses()), std::string(config_name(layout)), (long long)seq,
                 (long long)T, wall * 1e3, compute * 1e3, cpu * 1e3, a2a * 1e3, wait * 1e3,
                 exposed * 1e3, alone * 1e3, hidden, bytes / 1048576.0, err, (long long)wrong});
  return (long long)wrong;
}

}  // namespace

int run_cp_modes(const Config& cfg, const CpModesOptions& o) {
  const int cp = comm_world_size();
  check_modes(o, cp);
  BenchJob job = open_job(cfg);
  Communicator &world = job.world(), &group = *job.all;
  BenchTable table = make_table(o, cp);
  Verdict verdict("wrong rows in total");
  for (int64_t T : o.seq_per_rank) {
    const int64_t seq = T * cp;
    for (CpLayout layout : o.layouts) {
      cp::check_layout(seq, cp, layout);
      std::vector<std::unique_ptr<ModeCase>> cases;
      for (CpMode m : o.modes)
        cases.push_back(std::make_unique<ModeCase>(
            group, job.ctx(), m, m == CpMode::ulysses ? cp : o.ulysses, layout, seq, o));
      for (int it = 0; it < o.iters; ++it)
        for (auto& c : cases) c->iterate(world);
      for (auto& c : cases) verdict.add(add_mode_row(world, *c, layout, T, table));
      if (world.rank() == 0)
        std::fprintf(stderr, "  done: %s seq/cp %lld\n", config_name(layout).c_str(),
                     static_cast<long long>(T));
    }
  }
  if (world.rank() == 0) std::fputs(table.format().c_str(), stdout);
  verdict.print(world.rank());
  write_report(o.output, {table}, world.rank(), o.command_line);
  world.barrier();
  verdict.print_error(world.rank(), "bench ring --cp-mode",
                      "output rows differ from the fp64 reference");
  return verdict.exit_code();
}

}  // namespace trident::bench
