// `trident bench schedule`: runs the pipeline executor under mpirun (-np P)
// with synthetic stage work of given durations (sleeping, so oversubscribed
// cores do not distort it) and prints, per schedule, the measured bubble next
// to the simulator's prediction and the closed form, the peak in-flight
// activations, and the executor's own overhead per action. The simulator runs
// twice: with zero latency (the schedule's own bubble), and with the hop
// latency measured in this run (median over the messages whose receiver was
// already waiting of receive end - send begin), which is what the executor
// really pays per pipeline hop. The job comes from the config
// (bench::open_job): the pipeline's messages go over runtime.comm's backend
// (BenchJob::all, pp = world size) and the boundary buffers live on the
// rank's device. The boundary data is verifiable by construction (each
// forward writes values derived from its stage and micro-batch, each
// receiver checks them): mismatches go to #wrong, the verdict line
// ("# wrong boundary values in total: N") and make the exit code 1. The
// last step's timeline goes to the HDF5 file.
#include "trident/bench/schedule.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>

#include "trident/bench/engine.hpp"
#include "trident/comm/comm.hpp"
#include "trident/comm/process.hpp"
#include "trident/core/error.hpp"
#include "trident/core/profiler.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/parallel/pp/executor.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/parallel/pp/simulator.hpp"

namespace trident::bench {
namespace {

using namespace trident::pp;

// Stage work that takes a set time without using a core (or spinning, if
// asked), its boundary buffers on ctx's device.
class SyntheticStage : public PipelineStage {
 public:
  SyntheticStage(const kernels::Ctx& ctx, const Schedule& s, int rank, int64_t numel, double f_s,
                 double b_s, double w_s, bool spin)
      : ctx_(ctx),
        s_(s),
        rank_(rank),
        numel_(numel),
        f_s_(f_s),
        b_s_(b_s),
        w_s_(w_s),
        spin_(spin) {}

  int64_t boundary_numel(int, int) override { return numel_; }
  Allocator& allocator() override { return kernels::allocator_of(ctx_); }

  void forward(int chunk, int mb, const Tensor& input, Tensor& output) override {
    const auto t0 = std::chrono::steady_clock::now();
    const int st = s_.stage_of(rank_, chunk);
    if (!input.empty()) check(input, st - 1, mb, 0.0f);
    if (!output.empty()) stamp(output, st, mb, 0.0f);
    work(t0, f_s_);
  }
  void backward(int chunk, int mb, const Tensor& grad_output, Tensor& grad_input,
                bool weight_grad) override {
    const auto t0 = std::chrono::steady_clock::now();
    const int st = s_.stage_of(rank_, chunk);
    if (!grad_output.empty()) check(grad_output, st + 1, mb, 0.5f);
    if (!grad_input.empty()) stamp(grad_input, st, mb, 0.5f);
    work(t0, weight_grad ? b_s_ + w_s_ : b_s_);
  }
  void backward_weight(int, int) override { work(std::chrono::steady_clock::now(), w_s_); }

  long long wrong = 0;

 private:
  // Values exact in fp32, distinct per (stage, micro-batch, direction).
  static float value(int st, int mb, float dir, int64_t i) {
    return float((st * 1000 + mb) % 65536) + dir + float(i % 7) * 0.125f;
  }
  // Three elements of a boundary buffer (on the device: one-element copies).
  void stamp(const Tensor& buf, int st, int mb, float dir) {
    for (int64_t i : {int64_t(0), numel_ / 2, numel_ - 1}) {
      const float x = value(st, mb, dir, i);
      Tensor dst = buf.view(i, {1});
      kernels::copy(ctx_, dst, kernels::from_host(ctx_, &x, {1}, DType::f32));
    }
  }
  void check(const Tensor& buf, int st, int mb, float dir) {
    for (int64_t i : {int64_t(0), numel_ / 2, numel_ - 1})
      wrong += kernels::to_host(ctx_, buf.view(i, {1})).ptr()[0] != value(st, mb, dir, i);
  }
  void work(std::chrono::steady_clock::time_point t0, double seconds) const {
    const auto until = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                std::chrono::duration<double>(seconds));
    if (spin_) {
      while (std::chrono::steady_clock::now() < until) {
      }
    } else {
      // Sleep to just short of the end, then yield until it: a plain sleep
      // wakes up ~50-100 us late (the kernel's timer slack, then the wake-up),
      // and that lateness, repeated on every action, would show up as bubble
      // the schedule does not have. run() sets the timer slack to 1 ns, so
      // the yielding tail, which competes for the cores, can be short.
      std::this_thread::sleep_until(until - std::chrono::microseconds(kYieldTailUs));
      while (std::chrono::steady_clock::now() < until) std::this_thread::yield();
    }
  }

  static constexpr int kYieldTailUs = 60;
  const kernels::Ctx& ctx_;
  const Schedule& s_;
  int rank_;
  int64_t numel_;
  double f_s_, b_s_, w_s_;
  bool spin_;
};

// One rank's numbers for one schedule, averaged over the measured steps.
struct RankStats {
  double makespan_s = 0, bubble = 0, overhead_per_action_s = 0, recv_wait_s = 0;
  double peak_inflight = 0, wrong = 0;
};

// Timeline events travel to rank 0 as fixed-size records.
struct EventRecord {
  int32_t rank, op, stage, chunk, microbatch, step;
  double t_begin_s, t_end_s;
};

class ScheduleBench {
 public:
  ScheduleBench(const Config& cfg, const ScheduleBenchOptions& o) : cfg_(cfg), o_(o) {}
  int run();

 private:
  // What one schedule measured: every rank's stats and (rank 0) every rank's
  // last-step actions.
  struct Measured {
    std::vector<RankStats> ranks;
    std::vector<EventRecord> every;
  };
  Measured measure(Communicator& pp, Communicator& all, const std::string& name, const Schedule& s,
                   double f, double b, double w);
  // Rank 0: the schedule's rows against the simulator (zero latency and the
  // measured hop latency) and the closed form.
  void add_rows(const std::string& name, int v, const Schedule& s, double f, double b, double w,
                const Measured& got);
  void make_tables();
  // Rank 0: the notes, then the tables printed.
  void finish(const std::vector<std::string>& names, const std::vector<std::string>& skipped);
  // Chunks per rank the named schedule runs here: --vpp for interleaved.
  int chunks(const std::string& name) const {
    return name == "interleaved" ? o_.vpp : default_vpp(name);
  }

  BenchTable summary_, per_rank_, timeline_;
  long long total_wrong_ = 0;
  double worst_dev_ = 0, worst_dev_hop_ = 0, worst_overhead_ = 0;

  static std::string fmt(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
  }

  void validate_flags(int world) const {
    if (o_.pp < 1) throw InputError("--pp " + std::to_string(o_.pp) + ": must be >= 1");
    if (o_.pp != world)
      throw InputError("--pp " + std::to_string(o_.pp) + ": must equal the number of MPI ranks (" +
                       std::to_string(world) + "); run under mpirun -np " + std::to_string(o_.pp));
    if (o_.schedule != "all" && o_.schedule != "gpipe") {
      const auto& n = schedule_names();
      if (std::find(n.begin(), n.end(), o_.schedule) == n.end())
        throw InputError("--schedule " + o_.schedule +
                         ": unknown (expected all, afab, 1f1b, interleaved, zb-h1, zb-v or "
                         "dualpipev)");
    }
    if (o_.m < 1) throw InputError("--microbatches " + std::to_string(o_.m) + ": must be >= 1");
    if (o_.vpp < 1) throw InputError("--vpp " + std::to_string(o_.vpp) + ": must be >= 1");
    // --vpp sets the interleaved schedule's chunks (default 2); the V schedules
    // always run 2, so it may be left out for them and for the others.
    if (o_.vpp_given && o_.vpp > 1 && o_.schedule != "all" && o_.schedule != "interleaved")
      throw InputError("--vpp " + std::to_string(o_.vpp) +
                       ": only the interleaved schedule takes it (zb-v and dualpipev run 2 "
                       "chunks per rank)");
    validate_work_flags();
  }

  // The flags of the synthetic work, the messages and the waits.
  void validate_work_flags() const {
    for (auto [v, flag] :
         {std::pair{o_.tf_ms, "--tf"}, std::pair{o_.tb_ms, "--tb"}, std::pair{o_.tw_ms, "--tw"}})
      if (!(v >= 0 && v <= 60000))
        throw InputError(std::string(flag) + ": must be in [0, 60000] ms");
    if (o_.steps < 1 || o_.steps > 1000) throw InputError("--steps: must be in [1, 1000]");
    if (o_.bytes < 4 || o_.bytes > (int64_t(1) << 30))
      throw InputError("--bytes: must be in [4, 2^30]");
    if (!(o_.timeout_s > 0)) throw InputError("--timeout: must be > 0");
    if (!(o_.recv_poll_ms >= 0 && o_.recv_poll_ms <= 60000))
      throw InputError("--recv-poll: must be in [0, 60000] ms");
  }

  // Rank 0 collects every rank's actions of the last step (this rank's:
  // `spans`) as table rows, with times relative to that step's first action,
  // and returns them (the other ranks get an empty list).
  std::vector<EventRecord> gather_timeline(Communicator& all, const std::string& name,
                                           const std::vector<prof::Span>& spans) {
    int n = int(spans.size());
    all.allreduce_max(&n, 1);
    std::vector<EventRecord> mine(n, EventRecord{-1, 0, 0, 0, 0, 0, 0, 0});
    for (size_t i = 0; i < spans.size(); ++i) {
      const auto& e = spans[i];
      int op = 0;
      while (op < 7 && std::string(e.kind) != op_name(Op(op))) ++op;
      mine[i] = {all.rank(), op, e.stage, e.chunk, e.microbatch, o_.steps, e.t_begin_s, e.t_end_s};
    }
    std::vector<EventRecord> every(size_t(n) * all.size());
    all.allgather(mine.data(), every.data(), sizeof(EventRecord) * n);
    if (all.rank() != 0) return {};
    double t0 = 1e300;
    for (const auto& e : every)
      if (e.rank >= 0) t0 = std::min(t0, e.t_begin_s);
    for (const auto& e : every) {
      if (e.rank < 0) continue;
      timeline_.add_row({name, (long long)e.rank, (long long)e.step, std::string(op_name(Op(e.op))),
                         (long long)e.stage, (long long)e.chunk, (long long)e.microbatch,
                         e.t_begin_s - t0, e.t_end_s - t0});
    }
    return every;
  }

  // The latency of a pipeline hop as the simulator means it (from a SEND to
  // its data being received): median over the messages whose RECV began
  // before their SEND of RECV end - SEND begin. Each pair of neighbour ranks
  // exchanges messages both ways, so an error in the ranks' clock offsets
  // adds to one direction what it takes from the other. 0 when no receive
  // waited.
  static double hop_latency_s(const std::vector<EventRecord>& every) {
    auto key = [](bool backward, int sending_stage, int mb) {
      return (int64_t(mb) * 2 + backward) * (int64_t(1) << 20) + sending_stage;
    };
    std::map<int64_t, double> send_begin;
    for (const auto& e : every)
      if (e.rank >= 0 && (Op(e.op) == Op::SEND_F || Op(e.op) == Op::SEND_B))
        send_begin[key(Op(e.op) == Op::SEND_B, e.stage, e.microbatch)] = e.t_begin_s;
    std::vector<double> hops;
    for (const auto& e : every) {
      if (e.rank < 0 || (Op(e.op) != Op::RECV_F && Op(e.op) != Op::RECV_B)) continue;
      const bool backward = Op(e.op) == Op::RECV_B;
      const auto it =
          send_begin.find(key(backward, backward ? e.stage + 1 : e.stage - 1, e.microbatch));
      if (it != send_begin.end() && e.t_begin_s < it->second)
        hops.push_back(e.t_end_s - it->second);
    }
    if (hops.empty()) return 0.0;
    std::nth_element(hops.begin(), hops.begin() + hops.size() / 2, hops.end());
    return std::max(0.0, hops[hops.size() / 2]);
  }

  const Config& cfg_;
  const ScheduleBenchOptions& o_;
  const kernels::Ctx* ctx_ = nullptr;  // the job's device: the boundary buffers
};

ScheduleBench::Measured ScheduleBench::measure(Communicator& pp, Communicator& all,
                                               const std::string& name, const Schedule& s, double f,
                                               double b, double w) {
  const int me = all.rank();
  SyntheticStage stage(*ctx_, s, me, std::max<int64_t>(1, int64_t(o_.bytes / sizeof(float))),
                       f * 1e-3, b * 1e-3, w * 1e-3, o_.spin);
  RankStats mine;
  prof::Recorder last_step;  // the actions of the last measured step
  for (int step = 0; step <= o_.steps; ++step) {
    all.barrier();
    ExecOptions opt;
    opt.recv_poll_s = o_.recv_poll_ms * 1e-3;
    if (step == o_.steps) opt.profiler = &last_step;
    const ExecResult res = execute(s, me, stage, pp, step, nullptr, opt);
    if (step == 0) continue;  // warm-up: first-touch buffers, connection set-up
    mine.makespan_s += res.makespan_s / o_.steps;
    mine.bubble += res.bubble_fraction / o_.steps;
    mine.recv_wait_s += res.recv_wait_s / o_.steps;
    mine.overhead_per_action_s += res.overhead_s / double(s.ranks[me].size()) / o_.steps;
    mine.peak_inflight = std::max(mine.peak_inflight, double(res.peak_inflight));
  }
  mine.wrong = double(stage.wrong);
  Measured got;
  got.ranks.resize(size_t(all.size()));
  all.allgather(&mine, got.ranks.data(), sizeof(RankStats));
  got.every = gather_timeline(all, name, last_step.spans());
  return got;
}

void ScheduleBench::add_rows(const std::string& name, int v, const Schedule& s, double f, double b,
                             double w, const Measured& got) {
  const SimResult sim = simulate(s, SimCosts{f, b, w, 0.0});
  const ClosedForm cf = closed_form_bubble(name, o_.pp, o_.m, v, f, b, w);
  const double hop_s = hop_latency_s(got.every);
  const SimResult sim_hop = simulate(s, SimCosts{f, b, w, hop_s * 1e3});
  const int world = int(got.ranks.size());
  double dev = 0, dev_hop = 0, bubble = 0, overhead = 0, makespan = 0;
  int peak = 0;
  long long wrong = 0;
  for (int r = 0; r < world; ++r) {
    const RankStats& st = got.ranks[size_t(r)];
    const double d = 100.0 * std::abs(st.bubble - sim.ranks[r].bubble_fraction);
    const double d_hop = 100.0 * std::abs(st.bubble - sim_hop.ranks[r].bubble_fraction);
    dev = std::max(dev, d);
    dev_hop = std::max(dev_hop, d_hop);
    bubble += st.bubble / world;
    overhead = std::max(overhead, st.overhead_per_action_s);
    makespan = std::max(makespan, st.makespan_s);
    peak = std::max(peak, int(st.peak_inflight));
    wrong += (long long)st.wrong;
    per_rank_.add_row({name, (long long)r, st.bubble, sim.ranks[r].bubble_fraction, d,
                       sim_hop.ranks[r].bubble_fraction, d_hop, st.recv_wait_s * 1e3,
                       (long long)st.peak_inflight, (long long)sim.ranks[r].peak_inflight,
                       st.overhead_per_action_s * 1e6});
  }
  summary_.add_row({name, (long long)v, makespan * 1e3, sim.makespan, bubble, sim.mean_bubble(),
                    dev, hop_s * 1e6, sim_hop.mean_bubble(), dev_hop,
                    cf.exists() ? cf.formula : std::string("-"),
                    cf.exists() ? cf.fraction : std::nan(""), (long long)peak,
                    (long long)sim.max_peak_inflight(), overhead * 1e6, wrong});
  total_wrong_ += wrong;
  worst_dev_ = std::max(worst_dev_, dev);
  worst_dev_hop_ = std::max(worst_dev_hop_, dev_hop);
  worst_overhead_ = std::max(worst_overhead_, overhead);
}

void ScheduleBench::finish(const std::vector<std::string>& names,
                           const std::vector<std::string>& skipped) {
  double shortest_ms = 1e300;
  for (double t : {o_.tf_ms, o_.tb_ms, o_.tw_ms})
    if (t > 0) shortest_ms = std::min(shortest_ms, t);
  int most_chunks = 1;
  for (const std::string& n : names) most_chunks = std::max(most_chunks, chunks(n));
  shortest_ms /= most_chunks;
  summary_.notes = {
      "bubble = 1 - busy/makespan, makespan = first action begin to last action end over "
      "ranks (as in the simulator); mean over ranks",
      "sim = simulator with the same costs, zero latency; sim_hop = with latency hop_us, "
      "the median over this run's last step of receive end - send begin for messages "
      "whose receiver was already waiting",
      "formula_bubble = the closed form as a fraction of the makespan",
      "max_dev_pp / max_dev_hop_pp = largest |measured - simulated| bubble over ranks, in "
      "percentage points",
      "overhead = elapsed - compute - receive waits - sends, per action (largest rank)",
      "worst deviation " + fmt(worst_dev_) + " pp from sim, " + fmt(worst_dev_hop_) +
          " pp from sim_hop (target < 2), worst overhead " + fmt(worst_overhead_ * 1e6) +
          " us/action (" + fmt(100.0 * worst_overhead_ / (shortest_ms * 1e-3)) +
          "% of the shortest action)"};
  for (const std::string& n : skipped)
    summary_.notes.push_back(n + " not run: it needs at least " +
                             std::to_string(min_microbatches(n, o_.pp, chunks(n))) +
                             " micro-batches at pp=" + std::to_string(o_.pp));
  std::printf("%s\n%s\n", summary_.format().c_str(), per_rank_.format().c_str());
  std::fflush(stdout);
}

void ScheduleBench::make_tables() {
  summary_ = TableSpec{
      "schedule",
      "trident bench schedule: pp=" + std::to_string(o_.pp) +
          " microbatches=" + std::to_string(o_.m) + " tF=" + fmt(o_.tf_ms) +
          " tB=" + fmt(o_.tb_ms) + " tW=" + fmt(o_.tw_ms) + " ms (" +
          (o_.spin ? "spinning" : "sleeping") + "), " + std::to_string(o_.steps) +
          " measured steps, " + std::to_string(o_.bytes) + " B per message",
      {"schedule", "v", "makespan_ms", "sim_ms", "bubble", "sim_bubble", "max_dev_pp", "hop_us",
       "sim_hop_bubble", "max_dev_hop_pp", "formula", "formula_bubble", "peak_act", "sim_peak_act",
       "overhead_us/action", "#wrong"},
      {}}.make();
  per_rank_ = TableSpec{
      "schedule_ranks",
      "per rank",
      {"schedule", "rank", "bubble", "sim_bubble", "dev_pp", "sim_hop_bubble", "dev_hop_pp",
       "recv_wait_ms", "peak_act", "sim_peak_act", "overhead_us/action"},
      {}}.make();
  timeline_ = TableSpec{
      "schedule_timeline",
      "",
      {"schedule", "rank", "step", "kind", "stage", "chunk", "microbatch", "t_begin_s", "t_end_s"},
      {}}.make();
}

int ScheduleBench::run() {
  // Sleeping work should end on time: the default 50 us timer slack of a
  // normal thread would add to every action (Linux; harmless elsewhere).
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  validate_flags(comm_world_size());
  std::vector<std::string> names, skipped;
  if (o_.schedule == "all") {
    // Every schedule whose rules accept this pp and m (the others are named in a note).
    for (const std::string& n : schedule_names())
      (o_.m >= min_microbatches(n, o_.pp, chunks(n)) ? names : skipped).push_back(n);
  } else {
    names = {o_.schedule == "gpipe" ? "afab" : o_.schedule};
  }
  BenchJob job = open_job(cfg_);
  ctx_ = &job.ctx();
  sync_clock(job.world());
  Communicator &pp = *job.all, &all = job.world();
  make_tables();
  for (const std::string& name : names) {
    const int v = chunks(name);
    const Schedule s = lower(make_schedule(name, o_.pp, o_.m, v));
    // The same model split into v chunks: each chunk does 1/v of the work.
    const double f = o_.tf_ms / v, b = o_.tb_ms / v, w = o_.tw_ms / v;
    const Measured got = measure(pp, all, name, s, f, b, w);
    if (all.rank() == 0) add_rows(name, v, s, f, b, w, got);
  }
  Verdict verdict("wrong boundary values in total");
  long long wrong_all = total_wrong_;
  all.broadcast(&wrong_all, sizeof wrong_all, 0);
  verdict.add(wrong_all);
  if (all.rank() == 0) finish(names, skipped);
  verdict.print(all.rank());
  write_report(o_.output, {summary_, per_rank_, timeline_}, all.rank(), o_.command_line);
  if (all.rank() == 0 && !o_.output.empty())
    std::printf("wrote %s (timeline of the last step: /bench/schedule_timeline)\n",
                o_.output.c_str());
  all.barrier();
  verdict.print_error(all.rank(), "bench schedule", "boundary values differ from those sent");
  return verdict.exit_code();
}

}  // namespace

int run_schedule_bench(const Config& cfg, const ScheduleBenchOptions& opt) {
  return ScheduleBench(cfg, opt).run();
}

}  // namespace trident::bench
