// `trident bench moe`: MoE dispatch and combine through TokenDispatcher (ep =
// all ranks), with each transport (alltoallv, shm), against a plain
// all-to-all-v of the same bytes on the same communicator in the same run,
// for balanced and skewed routing, with the time split into count exchange,
// permute, transfer, expert compute and combine. The job comes from the
// config (bench::open_job): ep is every rank as one group on runtime.comm's
// backend (split off job.all as a group of kind ep), and every buffer lives
// on runtime.backend's device.
// Before timing, one pass with identity experts checks every combined
// element against the local weighted sum of the token's copies (#wrong),
// and the bytes the ep group's counters saw against the routed copies; a
// mismatch makes the exit code 1.
#include "trident/bench/moe.hpp"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "trident/bench/engine.hpp"
#include "trident/comm/comm.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/blas.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/parallel/ep/token_dispatcher.hpp"

namespace trident::bench {
namespace {

using ep::DispatchPlan;
using ep::TokenDispatcher;

// k distinct experts per token. Balanced: round robin, every expert gets
// exactly T*k/E copies. Skewed: expert e drawn with weight 1/(e+1), without
// replacement, so the ranks holding the first experts receive the most.
std::vector<int> make_routing(bool skewed, int64_t T, int E, int k, int rank) {
  std::vector<int> expert(static_cast<size_t>(T * k));
  const uint64_t key = rng::hash_name("bench.moe.routing");
  std::vector<double> w(E);
  for (int64_t t = 0; t < T; ++t) {
    if (!skewed) {
      for (int j = 0; j < k; ++j) expert[t * k + j] = int((t * k + j + int64_t(rank) * k) % E);
      continue;
    }
    for (int e = 0; e < E; ++e) w[e] = 1.0 / (e + 1);
    for (int j = 0; j < k; ++j) {
      double total = 0;
      for (double v : w) total += v;
      double u = rng::uniform(key, (uint64_t(rank) * uint64_t(T) + uint64_t(t)) * 16 + j) * total;
      int pick = 0;
      while (pick < E - 1 && (u >= w[pick] || w[pick] == 0)) u -= w[pick++];
      while (w[pick] == 0) pick = (pick + 1) % E;
      expert[t * k + j] = pick;
      w[pick] = 0;
    }
  }
  return expert;
}

// What every routing and transport is measured on (on the job's device):
// this rank's token rows x [T, d], the routing weights [T*k], and the local
// experts' SwiGLU weights (ffn > 0): wg, wu [L, f, d] and wd [L, d, f].
struct MoeInputs {
  Tensor x, weight, wg, wu, wd;
  // Expert e's matrix of w ([f, d], or [d, f] for wd).
  static Tensor expert(const Tensor& w, int e) {
    return w.view(e * w.dim(1) * w.dim(2), {w.dim(1), w.dim(2)});
  }
};

// numel(shape) normal numbers of stream `key` (from element `first` on,
// scaled by `scale`) on ctx's device.
Tensor normal_tensor(const kernels::Ctx& ctx, std::vector<int64_t> shape, const char* key,
                     uint64_t first, float scale) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  rng::fill_normal(v.data(), n, rng::hash_name(key), first, scale);
  return kernels::from_host(ctx, v.data(), std::move(shape), DType::f32);
}

MoeInputs make_inputs(const kernels::Ctx& ctx, int rank, int64_t T, int64_t d, int64_t f, int k,
                      int L) {
  MoeInputs in;
  in.x = normal_tensor(ctx, {T, d}, "bench.moe.x", uint64_t(rank) * T * d, 1.0f);
  std::vector<float> weight(static_cast<size_t>(T * k));
  for (int64_t t = 0; t < T; ++t) {
    float s = 0;
    for (int j = 0; j < k; ++j)
      s += weight[t * k + j] = 0.1f + rng::uniform(rng::hash_name("bench.moe.w"), t * k + j);
    for (int j = 0; j < k; ++j) weight[t * k + j] /= s;
  }
  in.weight = kernels::from_host(ctx, weight.data(), {T * k}, DType::f32);
  if (f > 0) {
    in.wg = normal_tensor(ctx, {L, f, d}, "bench.moe.wg", 0, 0.02f);
    in.wu = normal_tensor(ctx, {L, f, d}, "bench.moe.wu", 0, 0.02f);
    in.wd = normal_tensor(ctx, {L, d, f}, "bench.moe.wd", 0, 0.02f);
  }
  return in;
}

// The per-iteration times of measure(), in seconds: count, permute, a2a
// dispatch, expert, a2a combine, combine, raw forward, raw reverse, then the
// dispatch, combine and raw totals.
constexpr int kCols = 11;

// Slowest rank in each iteration, then the median over iterations (one
// descheduled iteration on a shared machine does not move it).
std::vector<double> slowest_rank_medians(Communicator& world, std::vector<double> per_iter,
                                         int iters) {
  world.allreduce_max(per_iter.data(), per_iter.size());
  std::vector<double> med(kCols);
  for (int c = 0; c < kCols; ++c) {
    std::vector<double> col;
    for (int it = 0; it < iters; ++it) col.push_back(per_iter[size_t(it) * kCols + size_t(c)]);
    med[size_t(c)] = median(col);
  }
  return med;
}

class MoeBench {
 public:
  MoeBench(const Config& cfg, const MoeBenchOptions& o) : cfg_(cfg), o_(o) {}

  int run() {
    check_options(comm_world_size());
    kernels::set_blas_threads(1);

    BenchJob job = open_job(cfg_);
    ctx_ = &job.ctx();
    Communicator& world = job.world();
    const int W = world.size(), rank = world.rank();
    // ep: every rank on runtime.comm's backend (job.all's), a group of kind
    // ep so that its traffic is counted as the trainer's ep group's is.
    const std::unique_ptr<Communicator> ep_group = job.all->split(0, rank, CommKind::ep, "ep");
    ep_group->set_compute_stream(ctx_->stream);
    Communicator& ep = *ep_group;
    const int E = o_.experts, k = o_.top_k;
    const MoeInputs in = make_inputs(*ctx_, rank, o_.tokens, o_.hidden, o_.ffn, k, E / W);

    BenchTable main_t = main_table(W), split_t = split_table();
    const std::vector<std::string> transports = transports_to_measure(ep, W, main_t);
    Verdict verdict("wrong elements or byte counts");
    for (bool skewed : {false, true}) {
      const char* name = skewed ? "skewed" : "balanced";
      const std::vector<int> expert = make_routing(skewed, o_.tokens, E, k, rank);
      for (const std::string& tr : transports) {
        const Result r = measure(ep, world, tr, expert, in);
        verdict.add(r.wrong);
        add_rows(name, tr, r, main_t, split_t);
      }
    }
    print_table(main_t, rank);
    print_table(split_t, rank);
    verdict.print(rank);
    write_report(o_.output, {main_t, split_t}, rank, o_.command_line);
    world.barrier();
    verdict.print_error(rank, "bench moe", "wrong elements or byte counts");
    return verdict.exit_code();
  }

 private:
  struct Result {
    // count, permute, a2a dispatch, expert, a2a combine, combine, raw forward, raw reverse
    double phase[8] = {};
    double dispatch_s = 0, combine_s = 0, raw_s = 0;
    double max_recv_bytes = 0, imbalance = 0;
    int64_t wrong = 0;  // wrong elements plus wrong byte counts, over all ranks
  };

  void check_options(int W) const {
    auto positive = [](const char* flag, long long v) {
      if (v < 1) throw InputError(std::string(flag) + " " + std::to_string(v) + ": must be >= 1");
    };
    positive("--hidden", o_.hidden);
    positive("--tokens", o_.tokens);
    positive("--experts", o_.experts);
    positive("--top-k", o_.top_k);
    positive("--iters", o_.iters);
    if (o_.ffn < 0) throw InputError("--ffn " + std::to_string(o_.ffn) + ": must be >= 0");
    if (o_.warmup < 0) throw InputError("--warmup " + std::to_string(o_.warmup) + ": must be >= 0");
    if (o_.top_k > o_.experts)
      throw InputError("--top-k " + std::to_string(o_.top_k) + ": must be <= --experts " +
                       std::to_string(o_.experts));
    if (o_.experts % W != 0)
      throw InputError("--experts " + std::to_string(o_.experts) + ": must be a multiple of the " +
                       std::to_string(W) + " ranks (experts are split evenly over ep = all ranks)");
  }

  BenchTable main_table(int W) const {
    BenchTable t;
    t.name = "moe";
    std::ostringstream title;
    title << "MoE dispatch + combine vs a raw all-to-all-v of the same bytes: " << W
          << " ranks (ep), d " << o_.hidden << ", " << o_.tokens << " tokens/rank, top-" << o_.top_k
          << " of " << o_.experts << " experts, "
          << (o_.ffn > 0 ? "SwiGLU experts f " + std::to_string(o_.ffn)
                         : std::string("identity experts"))
          << ", " << o_.iters << " iterations";
    t.title = title.str();
    t.columns = {"routing",     "transport",  "sent_B/rank", "max_recv_B",
                 "dispatch_ms", "combine_ms", "raw_a2a_ms",  "moe_GB/s",
                 "raw_GB/s",    "overhead_%", "imbalance",   "#wrong"};
    t.notes.push_back(
        "dispatch = count exchange + permute + transfer; combine = transfer back + weighted "
        "un-permute; raw = all-to-all-v forward + reverse of the same counts on the same ep "
        "group (every rank, runtime.comm's backend)");
    t.notes.push_back(
        "alltoallv: rows gathered into a send buffer, all-to-all-v both ways as one message per "
        "(source, expert) block (rows land in expert order), then the weighted sum; shm: sources "
        "write rows from x straight into the expert ranks' shared "
        "inboxes (permute_ms is then only the index sort), experts read them there and write "
        "their shared outboxes, each source sums its copies' rows from there (a2a_comb_ms: the "
        "fence, combine_ms: reads + sums); both keep what the layer's backward needs");
    t.notes.push_back(
        "overhead = (dispatch + combine) / raw - 1 (expert compute and the wait for the slowest "
        "expert rank excluded: a barrier precedes the combine); GB/s = 2 x sent "
        "bytes per rank / time; times: slowest rank of each iteration, median over iterations "
        "(each phase on its own, so the split need not add up to the totals exactly)");
    return t;
  }

  static BenchTable split_table() {
    BenchTable t;
    t.name = "moe_split";
    t.title = "Time split per iteration (ms, slowest rank, median over iterations)";
    t.columns = {"routing",     "transport",  "count_ms", "permute_ms", "a2a_disp_ms", "expert_ms",
                 "a2a_comb_ms", "combine_ms", "total_ms", "raw_fwd_ms", "raw_rev_ms"};
    return t;
  }

  // --transport all: alltoallv, and shm where the ranks can share memory
  // and the rows are on the host (else a note on the table says why not).
  std::vector<std::string> transports_to_measure(Communicator& ep, int W, BenchTable& t) const {
    if (o_.transport == "shm" && !ctx_->device.is_cpu() && W > 1)
      throw InputError("--transport shm: the rows are on " + ctx_->device.str() +
                       ", shm's windows in host memory (runtime.backend); use alltoallv or all");
    if (o_.transport != "all") return {o_.transport};
    std::vector<std::string> transports = {"alltoallv"};
    TokenDispatcher probe(&ep, o_.experts, EpTransportChoice::automatic, 0, *ctx_);
    if (W == 1 || probe.transport() == ep::EpTransport::shm)
      transports.push_back("shm");
    else
      t.notes.push_back("shm not measured: " + probe.transport_reason());
    return transports;
  }

  void add_rows(const char* name, const std::string& tr, const Result& r, BenchTable& main_t,
                BenchTable& split_t) const {
    const double sent_bytes = double(o_.tokens) * o_.top_k * o_.hidden * sizeof(float);
    const double moe_s = r.dispatch_s + r.combine_s;
    main_t.add_row({std::string(name), tr, static_cast<long long>(sent_bytes),
                    static_cast<long long>(r.max_recv_bytes), r.dispatch_s * 1e3, r.combine_s * 1e3,
                    r.raw_s * 1e3, 2 * sent_bytes / moe_s / 1e9, 2 * sent_bytes / r.raw_s / 1e9,
                    100.0 * (moe_s / r.raw_s - 1.0), r.imbalance, static_cast<long long>(r.wrong)});
    const double* ph = r.phase;
    split_t.add_row({std::string(name), tr, ph[0] * 1e3, ph[1] * 1e3, ph[2] * 1e3, ph[3] * 1e3,
                     ph[4] * 1e3, ph[5] * 1e3,
                     (ph[0] + ph[1] + ph[2] + ph[3] + ph[4] + ph[5]) * 1e3, ph[6] * 1e3,
                     ph[7] * 1e3});
  }

  // The local experts on the received rows: rows->in() read, rows->out()
  // written (shm: the shared inbox and outbox); an identity expert is a
  // copy, timed as expert compute like the SwiGLU. Returns the seconds.
  double run_experts(const DispatchPlan& plan, ep::ForwardRows& rows, bool identity,
                     const MoeInputs& in, Tensor& gate, Tensor& up) const {
    const kernels::Ctx& ctx = *ctx_;
    const int64_t f = o_.ffn, R = plan.received();
    const int L = o_.experts / plan.ep_size;
    const double t0 = device_now_s(ctx);
    if (f == 0 || identity) {
      Tensor out = rows.out();
      kernels::copy(ctx, out, rows.in());
      return device_now_s(ctx) - t0;
    }
    kernels::reserve(ctx, gate, R * f);
    kernels::reserve(ctx, up, R * f);
    for (int e = 0; e < L; ++e)
      for (int r = 0; r < plan.ep_size; ++r) {
        const int64_t n = plan.chunk_rows[r * L + e], off = plan.chunk_offset[r * L + e];
        kernels::swiglu_forward(ctx, rows.in().rows(off, off + n), MoeInputs::expert(in.wg, e),
                                MoeInputs::expert(in.wu, e), MoeInputs::expert(in.wd, e),
                                rows.out().rows(off, off + n), gate.view(off * f, {n, f}),
                                up.view(off * f, {n, f}));
      }
    return device_now_s(ctx) - t0;
  }

  // The verified pass (identity experts): wrong elements of y against the
  // weighted sum of the token's own copies computed here without any
  // communication (both brought to the host to compare), and wrong byte
  // counts (the ep group's counters count bytes that leave the rank: both
  // transfers and the count exchange, an all-gather of E counts, and one
  // int when the shm blocks grow).
  int64_t count_wrong(const DispatchPlan& plan, const Tensor& send, const Tensor& y,
                      const MoeInputs& in, double ep_bytes, int growths) const {
    const int64_t T = o_.tokens, d = o_.hidden, S = plan.sent(), R = plan.received();
    const int k = o_.top_k, rank = plan.ep_rank;
    const Tensor local = kernels::empty(*ctx_, {T, d});
    kernels::combine_rows(*ctx_, send, plan.row_of, in.weight, k, local);
    const Tensor want = kernels::to_host(*ctx_, local), got = kernels::to_host(*ctx_, y);
    int64_t wrong = 0;
    for (int64_t i = 0; i < want.numel(); ++i) wrong += want[i] != got[i];
    const double off_rank =
        double(S - plan.send_rows[rank] + R - plan.recv_rows[rank]) * double(d) * sizeof(float);
    const double control = double(o_.experts) * sizeof(int64_t) + double(growths) * sizeof(int);
    wrong += plan.ep_size > 1 && ep_bytes != off_rank + control;
    wrong += S != T * k;  // dropless: no padding, every copy sent once
    return wrong;
  }

  // The same bytes through a plain all-to-all-v of rows on the ep group,
  // both ways, device buffers (recv, back: grown as needed); rows arrive
  // source-major, as MPI delivers them. Returns (forward, reverse) seconds.
  std::pair<double, double> raw_alltoallv(Communicator& ep, Communicator& world,
                                          const DispatchPlan& plan, const Tensor& send,
                                          Tensor& recv, Tensor& back) const {
    const int W = plan.ep_size;
    const size_t row_bytes = size_t(o_.hidden) * sizeof(float);
    std::vector<int64_t> rd(size_t(W), 0);
    for (int r = 1; r < W; ++r) rd[size_t(r)] = rd[size_t(r - 1)] + plan.recv_rows[size_t(r - 1)];
    kernels::reserve(*ctx_, recv, plan.received() * o_.hidden);
    kernels::reserve(*ctx_, back, plan.sent() * o_.hidden);
    world.barrier();
    double t0 = device_now_s(*ctx_);
    ep.alltoallv(send.data_ptr(), plan.send_rows, plan.send_displ, recv.data_ptr(), plan.recv_rows,
                 rd, row_bytes);
    const double fwd = device_now_s(*ctx_) - t0;
    t0 = device_now_s(*ctx_);
    ep.alltoallv(recv.data_ptr(), plan.recv_rows, rd, back.data_ptr(), plan.send_rows,
                 plan.send_displ, row_bytes);
    return {fwd, device_now_s(*ctx_) - t0};
  }

  // The seconds of one timed iteration in measure()'s kCols order, from the
  // dispatcher's spans (tm), the expert compute and the raw all-to-all-v.
  static void add_iteration(std::vector<double>& per_iter, const prof::Recorder& tm,
                            double expert_s, double raw_fwd, double raw_rev) {
    const double count_s = tm.seconds("ep.count"), permute = tm.seconds("ep.permute");
    const double a2a_dispatch = tm.seconds("ep.dispatch"), a2a_combine = tm.seconds("ep.return");
    const double combine_s = tm.seconds("ep.combine");
    const double v[kCols] = {count_s,
                             permute,
                             a2a_dispatch,
                             expert_s,
                             a2a_combine,
                             combine_s,
                             raw_fwd,
                             raw_rev,
                             count_s + permute + a2a_dispatch,
                             a2a_combine + combine_s,
                             raw_fwd + raw_rev};
    per_iter.insert(per_iter.end(), v, v + kCols);
  }

  // One routing through one transport: a verified pass with identity
  // experts, then warm-up and timed iterations, each followed by the raw
  // all-to-all-v of the same counts. Times: slowest rank, median over iterations.
  Result measure(Communicator& ep, Communicator& world, const std::string& transport,
                 const std::vector<int>& expert, const MoeInputs& in) {
    const int64_t T = o_.tokens, d = o_.hidden;
    const int k = o_.top_k;
    const kernels::Ctx& ctx = *ctx_;
    TokenDispatcher disp(&ep, o_.experts, *parse_config_name<EpTransportChoice>(transport), 0, ctx);
    prof::Recorder tm(false);  // the phases of one iteration (cleared before each)
    disp.set_profiler(&tm);
    Tensor send_buffer, gate, up, recv, back;
    const Tensor y = kernels::empty(ctx, {T, d});
    std::vector<double> per_iter;  // [iters, kCols] seconds, this rank
    int64_t wrong = 0;
    DispatchPlan plan;
    for (int it = -1; it < o_.warmup + o_.iters; ++it) {
      const int growths0 = disp.shm_growths();
      const bool verify = it < 0, timed = it >= o_.warmup;
      world.barrier();
      const double ep_bytes0 = ep.counters().bytes_sent[int(CommKind::ep)];
      tm.clear();
      plan = disp.plan(expert, T, k);
      std::unique_ptr<ep::ForwardRows> rows = disp.dispatch_forward(plan, in.x);
      const double expert_s = run_experts(plan, *rows, verify, in, gate, up);
      // Expert compute is not the exchange's cost, and neither is waiting for
      // the busiest expert rank: the combine starts aligned, as the raw
      // all-to-all does.
      world.barrier();
      disp.combine_forward(plan, *rows, in.weight, y);
      rows.reset();  // as the layer does after its backward
      const double ep_bytes = ep.counters().bytes_sent[int(CommKind::ep)] - ep_bytes0;

      // The send rows of the raw all-to-all (and of the local reference).
      kernels::reserve(ctx, send_buffer, plan.sent() * d);
      const Tensor send = send_buffer.view(0, {plan.sent(), d});
      kernels::gather_rows(ctx, in.x, plan.send_token, send);
      if (verify) {
        wrong += count_wrong(plan, send, y, in, ep_bytes, disp.shm_growths() - growths0);
        continue;
      }
      const auto [raw_fwd, raw_rev] = raw_alltoallv(ep, world, plan, send, recv, back);
      if (timed) add_iteration(per_iter, tm, expert_s, raw_fwd, raw_rev);
    }
    return summarise(world, plan, slowest_rank_medians(world, per_iter, o_.iters), wrong);
  }

  // The result over all ranks: medians as phases and totals, the largest
  // receive, the expert load imbalance and the wrong counts summed.
  Result summarise(Communicator& world, const DispatchPlan& plan, const std::vector<double>& med,
                   int64_t wrong) const {
    Result res;
    world.allreduce_sum(&wrong, 1);
    double max_recv_rows = double(plan.received());
    world.allreduce_max(&max_recv_rows, 1);
    std::vector<int64_t> load = plan.tokens_per_expert;
    world.allreduce_sum(load.data(), load.size());
    const double mean_load = double(o_.tokens) * o_.top_k * world.size() / o_.experts;
    std::copy(med.begin(), med.begin() + 8, res.phase);
    res.dispatch_s = med[8];
    res.combine_s = med[9];
    res.raw_s = med[10];
    res.max_recv_bytes = max_recv_rows * double(o_.hidden) * sizeof(float);
    res.imbalance = double(*std::max_element(load.begin(), load.end())) / mean_load;
    res.wrong = wrong;
    return res;
  }

  const Config& cfg_;
  const MoeBenchOptions& o_;
  const kernels::Ctx* ctx_ = nullptr;  // the job's device (run())
};

}  // namespace

int run_moe_bench(const Config& cfg, const MoeBenchOptions& opt) {
  return MoeBench(cfg, opt).run();
}

}  // namespace trident::bench
