// Calibration benchmarks (see calibrate.hpp): each is a small closure timed by
// one harness, on one rank alone or on every rank at once.
#include "trident/plan/calibrate.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "trident/kernels/backend.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/model/blocks.hpp"
#include "trident/model/data.hpp"
#include "trident/model/transformer.hpp"
#include "trident/parallel/dp/grad_reduce.hpp"
#include "trident/plan/cost_model.hpp"
#include "trident/plan/predict.hpp"
#include "trident/train/optimizer.hpp"
#include "trident/train/trainer.hpp"

namespace trident::plan {
namespace {

double median_of(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Median seconds of fn over repetitions lasting about `budget` seconds.
double median_time(const std::function<void()>& fn, double budget) {
  std::vector<double> t;
  const double start = now_s();
  do {
    const double t0 = now_s();
    fn();
    t.push_back(now_s() - t0);
  } while (now_s() - start < budget || t.size() < 3);
  return median_of(std::move(t));
}

// The ranks in `work` run fn at once while the others sleep (they would
// otherwise spin in MPI and take the cores); the slowest worker's median
// over about `budget` seconds, on every rank.
double together(Communicator& world, const std::vector<bool>& work, const std::function<void()>& fn,
                double budget) {
  double t = 0;
  world.barrier();
  if (work[size_t(world.rank())])
    t = median_time(fn, budget);
  else
    std::this_thread::sleep_for(std::chrono::duration<double>(budget * 2 + 0.1));
  world.allreduce_max(&t, 1);
  return t;
}

// Rank `who` alone.
double alone(Communicator& world, int who, const std::function<void()>& fn, double budget) {
  std::vector<bool> work(size_t(world.size()), false);
  work[size_t(who)] = true;
  return together(world, work, fn, budget);
}

// Node 0's first `k` ranks.
std::vector<bool> first_ranks_of_node0(const std::vector<int>& node_of, int k) {
  std::vector<bool> work(node_of.size(), false);
  for (size_t rank = 0; rank < node_of.size() && k > 0; ++rank)
    if (node_of[rank] == node_of[0]) work[rank] = true, --k;
  return work;
}

std::vector<float> filled(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + 1e-3f * float(i % 97);
  return v;
}

// The same values in a host tensor of `shape` (what the timed ops take).
Tensor filled_tensor(std::vector<int64_t> shape, float base) {
  Tensor t(std::move(shape));
  const std::vector<float> v = filled(size_t(t.numel()), base);
  std::copy(v.begin(), v.end(), t.values().begin());
  return t;
}

// One-way seconds of a ping-pong of `bytes` between ranks a and b (others sleep).
double one_way(Communicator& world, int a, int b, size_t bytes, double budget) {
  std::vector<char> buf(std::max<size_t>(bytes, 1));
  const int me = world.rank();
  const bool in = me == a || me == b;
  double t = 0;
  world.barrier();
  if (in) {
    const int peer = me == a ? b : a;
    auto round_trip = [&] {
      if (me == a) {
        Request s = world.isend(buf.data(), bytes, peer, 71);
        world.wait(s);
        Request r = world.irecv(buf.data(), bytes, peer, 72);
        world.wait(r);
      } else {
        Request r = world.irecv(buf.data(), bytes, peer, 71);
        world.wait(r);
        Request s = world.isend(buf.data(), bytes, peer, 72);
        world.wait(s);
      }
    };
    // Both sides must make the same number of round trips: a fixed count,
    // sized from a first estimate on rank a and agreed through the pair.
    round_trip();
    const double t0 = now_s();
    round_trip();
    const double once = std::max(now_s() - t0, 1e-7);
    const int n = int(std::clamp(budget / once, 10.0, 20000.0));
    int count = n;
    if (me == a) {
      Request s = world.isend(&count, sizeof count, peer, 73);
      world.wait(s);
    } else {
      Request r = world.irecv(&count, sizeof count, peer, 73);
      world.wait(r);
    }
    std::vector<double> times;
    for (int i = 0; i < count; ++i) {
      const double s0 = now_s();
      round_trip();
      times.push_back(now_s() - s0);
    }
    t = median_of(std::move(times)) / 2;
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(budget * 2 + 0.1));
  }
  world.allreduce_max(&t, 1);
  return t;
}

Link measure_link(Communicator& world, int a, int b, size_t big, double budget) {
  Link l;
  l.latency_s = one_way(world, a, b, 8, budget);
  const double t = one_way(world, a, b, big, budget);
  l.bandwidth_Bps = double(big) / std::max(t - l.latency_s, 1e-9);
  return l;
}

// Physical cores this process may run on: the distinct (package, core) of
// the CPUs in its affinity mask, so that two hardware threads of one core
// count once; 0 when the topology cannot be read.
int physical_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  std::set<std::pair<int, int>> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream package(dir + "physical_package_id"), core(dir + "core_id");
    int p = -1, c = -1;
    if (!(package >> p) || !(core >> c)) return 0;
    cores.insert({p, c});
  }
  return int(cores.size());
}

double host_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (in >> key >> kb)
    if (key == "MemTotal:") return kb * 1024;
  return 0;
}

}  // namespace

namespace {

struct Rates {
  double gemm = 0, attention = 0, memory = 0;
  double ranks_at_once = 0;    // node 0's ranks the cores ran at once (median over rounds)
  int cores = 0;               // the node's physical cores (or the count above, rounded)
  double wait_core_share = 0;  // share of a core a waiting rank takes there
  int rounds = 0;
};

// Calls of fn per second over about `window` seconds (at least 3 calls).
double call_rate(const std::function<void()>& fn, double window) {
  const double start = now_s();
  int calls = 0;
  double t = 0;
  do {
    fn();
    ++calls;
    t = now_s() - start;
  } while (t < window || calls < 3);
  return calls / t;
}

// Calls per second of fn, summed over node 0's ranks that `work`. The ranks
// that do not work either wait for a message from rank 0 (which works), as a
// rank of a pipeline waits for its input, so that the wait's polling runs
// alongside; or, with `idle_sleeps`, sleep and take no core. Every rank gets
// the sum.
double node_rate(Communicator& world, const std::vector<bool>& work, bool on_node0,
                 const std::function<void()>& fn, double window, bool idle_sleeps) {
  const int me = world.rank();
  char token = 0;
  double rate = 0;
  world.barrier();
  if (work[size_t(me)]) {
    rate = on_node0 ? call_rate(fn, window) : 0.0;
    if (me == 0 && !idle_sleeps) {
      std::vector<Request> sends;
      for (int r = 0; r < world.size(); ++r)
        if (!work[size_t(r)]) sends.push_back(world.isend(&token, 1, r, 74));
      world.wait_all(sends);
    }
  } else if (idle_sleeps) {
    std::this_thread::sleep_for(std::chrono::duration<double>(window * 2 + 0.1));
  } else {
    Request r = world.irecv(&token, 1, 0, 74);
    world.wait(r);
  }
  world.allreduce_sum(&rate, 1);
  return rate;
}

// How node 0's cores run its ranks, from fn's call rate. Rounds of: rank 0
// alone (the others sleep, so they take no core), then every rank at once;
// their ratio counts the ranks running at once. Then, when the ranks
// outnumber the cores, rounds in which as many ranks as there are cores
// work, once with the others asleep and once with them waiting: what the
// workers lose the second time is the waiters' share. Each figure is the
// median over its rounds, and each round compares measurements taken one
// right after the other, so that load from elsewhere touches both sides.
Rates measure_sharing(Communicator& world, const std::vector<int>& node_of,
                      const std::function<void()>& fn, double window, int rounds) {
  const int n = world.size(), me = world.rank();
  const bool on_node0 = node_of[size_t(me)] == node_of[0];
  const int per_node = int(std::count(node_of.begin(), node_of.end(), node_of[0]));
  const std::vector<bool> everyone(size_t(n), true);
  std::vector<bool> rank0(size_t(n), false);
  rank0[0] = true;
  std::vector<double> alone, at_once;
  for (int i = 0; i < rounds; ++i) {
    alone.push_back(node_rate(world, rank0, on_node0, fn, window, true));
    at_once.push_back(node_rate(world, everyone, on_node0, fn, window, true) / alone.back());
  }
  Rates r;
  r.rounds = rounds;
  r.ranks_at_once = median_of(at_once);
  // The cores are the hardware's when it says (a busy moment would make the
  // measured count low); the measured count stands in when it does not.
  const int physical = physical_cores();
  r.cores = physical > 0 ? std::min(physical, per_node)
                         : int(std::clamp(std::round(r.ranks_at_once), 1.0, double(per_node)));
  if (r.cores < per_node) {
    const std::vector<bool> work = first_ranks_of_node0(node_of, r.cores);
    std::vector<double> share;
    for (int i = 0; i < rounds; ++i) {
      const double asleep = node_rate(world, work, on_node0, fn, window, true);
      const double waiting = node_rate(world, work, on_node0, fn, window, false);
      share.push_back((asleep - waiting) / alone[size_t(i)] / (per_node - r.cores));
    }
    r.wait_core_share = std::clamp(median_of(share), 0.0, 1.0);
  }
  r.gemm = median_of(alone);  // calls per second; the caller scales by FLOPs
  return r;
}

// The config's shapes: one micro-batch of one rank (its cp share).
Rates measure_compute(Communicator& world, const std::vector<int>& node_of, const Config& cfg,
                      double budget) {
  const ModelConfig& mc = cfg.model;
  const int64_t seq = cfg.data.seq_len / cfg.parallel.cp;
  const int64_t T = int64_t(cfg.data.micro_batch_size) * seq, d = mc.d_model;
  const int64_t f = std::max<int64_t>(mc.ffn_hidden, d);
  const kernels::DeviceContext host(Device::cpu());  // the kernels as training runs them
  const kernels::Ctx& ctx = host.ctx();
  const Tensor a = filled_tensor({T, d}, 0.5f), b = filled_tensor({f, d}, -0.25f), c({T, f});
  auto gemm = [&] { kernels::linear_forward(ctx, a, b, c); };  // b: [f, d], as the model
  Rates r = measure_sharing(world, node_of, gemm, budget, 5);
  r.gemm *= 2.0 * T * d * f;

  kernels::AttnShape s;
  s.Tq = s.Tk = seq;
  s.H = mc.n_heads, s.Hkv = mc.n_kv_heads, s.D = mc.head_dim();
  s.scale = 1.0f / std::sqrt(float(s.D));
  s.causal = true;
  const Tensor q = filled_tensor({seq, s.H, s.D}, 0.1f),
               kv = filled_tensor({seq, s.Hkv, s.D}, 0.2f);
  const Tensor out({seq, s.H, s.D}), lse({seq, s.H}), dq({seq, s.H, s.D}), dk({seq, s.Hkv, s.D}),
      dv({seq, s.Hkv, s.D});
  const Tensor dout = filled_tensor({seq, s.H, s.D}, 0.3f);
  auto attention = [&] {
    kernels::attention_forward(ctx, s, q, kv, kv, out, lse);
    kernels::attention_backward(ctx, s, q, kv, kv, out, lse, dout, dq, dk, dv);
  };
  const double attn_flops =
      3.5 * causal_pairs_busiest_rank(seq, 1, CpLayout::zigzag) * 4 * s.H * s.D;
  r.attention = attn_flops / alone(world, 0, attention, budget);

  const Tensor y = filled_tensor({T, d}, 1.0f);
  auto add = [&] { kernels::add_inplace(ctx, y, a); };
  r.memory = 12.0 * T * d / alone(world, 0, add, budget);  // read x and y, write y
  return r;
}

// What the config's model on one rank (pp = cp = ep = 1) adds to the rates:
// efficiency and the fixed cost per layer and micro-batch from whole training
// steps at two micro-batch sizes, and the step's update per parameter (rank
// 0 alone, and with `at_once` ranks of its node updating together, as every
// rank of a mesh does); step_s: the median whole step at the config's size.
struct ModelFit {
  double efficiency = 1, layer_overhead_s = 0, optimizer_s_per_param = 0, step_s = 0;
  double optimizer_together_s_per_param = 0;
};

// Gradient norm and AdamW over the model's parameters: seconds per
// parameter alone (first) and with the ranks of `work` updating at once:
// the update streams the parameters, gradients and moments, so ranks that
// share a memory system slow each other down.
std::pair<double, double> update_seconds_per_param(Communicator& world, const Config& cfg,
                                                   const std::vector<bool>& work, double budget) {
  Config one = cfg;
  one.parallel = ParallelConfig{};
  model::ModelStage stage(one, 0, 1, model::StageComms{});
  const kernels::DeviceContext host(Device::cpu());
  const std::vector<Param*> params = stage.params();
  train::AdamW opt(params, one.train, host.ctx());
  double n = 0;
  for (const Param* p : params) n += double(p->value.numel());
  auto update = [&] {
    const double norm = dp::global_grad_sumsq(params, nullptr, nullptr, nullptr, host.ctx());
    opt.step(1e-9, float(1.0 / (1.0 + norm)));
  };
  const double by_one = alone(world, 0, update, budget) / n;
  const double at_once = together(world, work, update, budget) / n;
  return {by_one, std::max(by_one, at_once)};
}

// What a step costs beyond the work the model prices (the batch's data, the
// gradients zeroed, the guard's scans, the norm and the agreements, the
// update's bookkeeping, the trainer's own calls): the fit's whole training
// steps of the config's batch on one rank (pp = cp = ep = dp = 1, `step_s`)
// less the prediction of the same mesh without a fixed step cost. Every step
// of every mesh pays it once.
double step_overhead_seconds(const Config& cfg, const MachineProfile& m, double step_s) {
  Config one = cfg;
  one.parallel = ParallelConfig{};
  MachineProfile fixed_free = m;
  fixed_free.step_overhead_s = 0;
  const double priced =
      predict(one, mesh_plan_of(one, 1), ClusterShape{1, 1, 1}, fixed_free, false).step_time_s;
  return std::max(0.0, step_s - priced);
}

// Bytes of the one-rank model's gradient all-reduces: one call per kind
// (the dense gradients, the experts'), each at most 64 MiB.
std::vector<size_t> gradient_reduction_bytes(const Config& cfg) {
  Config one = cfg;
  one.parallel = ParallelConfig{};
  const MeshPlan p = mesh_plan_of(one, 1);
  double dense = 0, expert = 0;
  for (int vs = 0; vs < p.pp * p.vpp; ++vs) {
    const ChunkCost c = chunk_cost(one, p, vs);
    dense += c.params - c.expert_params;
    expert += c.expert_params;
  }
  std::vector<size_t> out;
  for (double n : {dense, expert})
    if (n > 0) out.push_back(size_t(std::min(4 * n, 64.0 * 1048576)));
  return out;
}

// Bus bandwidth (nccl-tests' busbw: 2 (k-1)/k bytes over the time) of the
// step's gradient all-reduces (one call per size in `bytes`, as the step
// makes them, in the order the trainer asks for: SumOrder::rank) over node
// 0's ranks of `work` (the others sleep). Large
// reductions run at another rate than a message (their arithmetic, buffers
// past the caches). 0 when fewer than 2 ranks work.
double allreduce_bus_Bps(Communicator& world, const std::vector<bool>& work,
                         const std::vector<size_t>& bytes, double budget) {
  const int k = int(std::count(work.begin(), work.end(), true));
  const bool in = work[size_t(world.rank())];
  auto group = world.split(in ? 0 : -1, world.rank(), CommKind::dp, "calibrate-allreduce");
  size_t total = 0;
  std::vector<std::vector<float>> bufs;
  for (size_t b : bytes) {
    total += b;
    if (in) bufs.push_back(filled(std::max<size_t>(b / sizeof(float), 1), 1e-3f));
  }
  auto reduce = [&] {
    for (auto& buf : bufs) group->allreduce_sum(buf.data(), buf.size(), SumOrder::rank);
  };
  double t = 0;
  world.barrier();
  if (k >= 2 && in) {
    reduce();  // first touches, the protocol's setup
    const double t0 = now_s();
    reduce();
    // every member makes the same number of calls: the slowest estimate's
    double calls = std::clamp(budget / std::max(now_s() - t0, 1e-7), 5.0, 2000.0);
    group->allreduce_max(&calls, 1);
    std::vector<double> times;
    for (int i = 0; i < int(calls); ++i) {
      const double s0 = now_s();
      reduce();
      times.push_back(now_s() - s0);
    }
    t = median_of(std::move(times));
  } else if (!in) {
    std::this_thread::sleep_for(std::chrono::duration<double>(budget * 2 + 0.1));
  }
  world.allreduce_max(&t, 1);
  return t > 0 ? 2.0 * (k - 1) / k * double(total) / t : 0.0;
}

// One of the step's small all-reduces (a few doubles) over every rank, all of
// them in it, per ceil(log2 n) round: rounds of a fixed count (every rank
// runs the same number), the median round.
double collective_round_seconds(Communicator& world) {
  if (world.size() < 2) return 0;
  constexpr int kCalls = 40, kRounds = 5;
  std::vector<double> per_call;
  double v[3] = {1, 2, 3};
  for (int r = 0; r < kRounds; ++r) {
    world.barrier();
    const double t0 = now_s();
    for (int i = 0; i < kCalls; ++i) world.allreduce_sum(v, 3);
    per_call.push_back((now_s() - t0) / kCalls);
  }
  double t = median_of(std::move(per_call));
  world.allreduce_max(&t, 1);
  return t / std::ceil(std::log2(double(world.size())));
}

// What one blocking exchange costs its ranks beyond its bytes when they
// compute between exchanges, as the ring's steps and the Ulysses and MoE
// all-to-alls do: the wait for the slowest peer, the handshake that only
// runs once both sides are in the library, and on shared cores the turn of a
// peer that is not running. Every rank runs rounds of one ring step's
// attention (the config's heads, seq/n queries against seq/n keys, n the
// calibrating ranks): alone, then each round followed by a ring step (the
// K/V block to the next rank, from the previous one), then by an all-to-all
// of the same bytes. Sets of the three alternate, so that load from
// elsewhere touches them alike. The medians of the differences per round,
// less the bytes at the link's rate, divided by the oversubscription (the
// prediction multiplies its own back in).
struct ExchangeCosts {
  double ring_step_s = 0, alltoall_s = 0;
};

ExchangeCosts exchange_costs(Communicator& world, const Config& cfg, const Link& link,
                             double oversubscription) {
  const int n = world.size(), me = world.rank();
  ExchangeCosts out;
  if (n < 2) return out;
  const ModelConfig& mc = cfg.model;
  // one off-diagonal ring step of one sequence: seq/n queries against seq/n keys
  const int64_t rows = std::max<int64_t>(1, cfg.data.seq_len / n);
  kernels::AttnShape shape;
  shape.Tq = shape.Tk = rows;
  shape.H = mc.n_heads, shape.Hkv = mc.n_kv_heads, shape.D = mc.head_dim();
  shape.scale = 1.0f / std::sqrt(float(shape.D));
  shape.causal = false;
  const size_t block = size_t(2 * rows * mc.n_kv_heads * mc.head_dim());  // K and V, floats
  const kernels::DeviceContext host(Device::cpu());
  const Tensor q = filled_tensor({rows, shape.H, shape.D}, 0.1f),
               kv = filled_tensor({rows, shape.Hkv, shape.D}, 0.2f);
  const Tensor o({rows, shape.H, shape.D}), lse({rows, shape.H});
  auto work = [&] { kernels::attention_forward(host.ctx(), shape, q, kv, kv, o, lse); };
  std::vector<float> send(block * size_t(n), 1.0f), recv(block * size_t(n));
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  constexpr int kTag = 7302, kRounds = 64, kSets = 7;
  auto ring_round = [&] {
    Request r = world.irecv(recv.data(), block * sizeof(float), prev, kTag);
    Request s = world.isend(send.data(), block * sizeof(float), next, kTag);
    work();
    world.wait(r);
    world.wait(s);
  };
  // the block split over the peers, as the all-to-alls split their tensors
  const int64_t per_peer = int64_t(std::max<size_t>(1, block / size_t(n)));
  std::vector<int64_t> counts(size_t(n), per_peer);
  std::vector<int64_t> displs = counts;
  for (int i = 0; i < n; ++i) displs[size_t(i)] = i * per_peer;
  counts[size_t(me)] = 0;
  auto a2a_round = [&] {
    work();
    world.alltoallv(send.data(), counts, displs, recv.data(), counts, displs, sizeof(float));
  };
  auto per_round = [&](const std::function<void()>& fn) {
    world.barrier();
    const double t0 = now_s();
    for (int i = 0; i < kRounds; ++i) fn();
    double t = (now_s() - t0) / kRounds;
    world.allreduce_max(&t, 1);
    return t;
  };
  std::vector<double> ring, a2a;
  for (int set = 0; set < kSets; ++set) {
    const double alone = per_round(work);
    ring.push_back(per_round(ring_round) - alone);
    a2a.push_back(per_round(a2a_round) - alone);
  }
  const double bytes = double(block) * sizeof(float);
  out.ring_step_s = std::max(0.0, median_of(ring) - link.seconds(bytes)) / oversubscription;
  out.alltoall_s =
      std::max(0.0, median_of(a2a) - (n - 1) * link.seconds(bytes / n)) / oversubscription;
  return out;
}

// Median seconds of whole training steps of `a` and `b` (the trainer's own
// steps: the batch's data, every micro-batch's forward and backward, the
// guard's scans, the norm and the update), timed alternately on rank 0 while
// the others sleep, so that a change of load on the node touches both alike.
std::pair<double, double> alternate_step_medians(Communicator& world, const Config& a,
                                                 const Config& b, double budget) {
  double t[2] = {0, 0};
  constexpr int kTag = 7303;
  world.barrier();
  if (world.rank() == 0) {
    train::Trainer ta(a, train::TrainComms{}), tb(b, train::TrainComms{});
    int64_t step = 0;
    ta.train_step(step, nullptr);  // first touches of the buffers
    tb.train_step(step++, nullptr);
    std::vector<double> xa, xb;
    const double start = now_s();
    do {
      double t0 = now_s();
      ta.train_step(step, nullptr);
      xa.push_back(now_s() - t0);
      t0 = now_s();
      tb.train_step(step++, nullptr);
      xb.push_back(now_s() - t0);
    } while (now_s() - start < 2 * budget || xa.size() < 7);
    t[0] = median_of(std::move(xa)), t[1] = median_of(std::move(xb));
    std::vector<Request> sends;
    for (int r = 1; r < world.size(); ++r) sends.push_back(world.isend(t, sizeof t, r, kTag));
    for (Request& r : sends) world.wait(r);
  } else {
    // sleep between polls, so that rank 0 has the cores to itself
    Request done = world.irecv(t, sizeof t, 0, kTag);
    while (!world.test(done)) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  world.barrier();
  return {t[0], t[1]};
}

// The config's model on one rank (pp = cp = ep = dp = 1) in whole training
// steps of its micro-batch count, at its micro-batch size and at a quarter
// of its tokens per micro-batch (below): the range that cp up to 4 puts on
// a rank at the same micro-batch size. Each step less its update is fixed + the cost
// model's price of its forwards and backwards at the rates / efficiency.
ModelFit fit_model(Communicator& world, const Config& cfg, const MachineProfile& m,
                   const std::vector<bool>& node_ranks, double budget) {
  ModelFit fit;
  std::tie(fit.optimizer_s_per_param, fit.optimizer_together_s_per_param) =
      update_seconds_per_param(world, cfg, node_ranks, budget);
  // The small point: a quarter of the micro-batch, or with one sequence per
  // micro-batch a quarter of the sequence (what cp = 4 leaves a rank), when
  // the data allow it; else four sequences.
  const int big = cfg.data.micro_batch_size;
  const int64_t seq = cfg.data.seq_len;
  const bool quarter_seq =
      big == 1 && seq % 4 == 0 && seq / 4 >= 16 && cfg.data.packing == Packing::none;
  auto one_rank = [&](int mbs, int64_t seq_len) {
    Config c = cfg;
    c.parallel = ParallelConfig{};
    c.runtime.verify_every = 0;
    c.data.micro_batch_size = mbs;
    c.data.seq_len = seq_len;
    return c;
  };
  const Config cb = one_rank(big, seq);
  const Config cs = big > 1       ? one_rank(std::max(1, big / 4), seq)
                    : quarter_seq ? one_rank(1, seq / 4)
                                  : one_rank(4, seq);
  MachineProfile at_rates = m;
  at_rates.efficiency = 1;
  auto priced = [&](const Config& c) {
    const ChunkCost cost = chunk_cost(c, mesh_plan_of(c, 1), 0);
    Work all = cost.f;
    all += cost.b;
    all += cost.w;
    return c.data.num_microbatches * compute_seconds(all, at_rates);
  };
  const double params = chunk_cost(cb, mesh_plan_of(cb, 1), 0).params;
  const double update = params * fit.optimizer_s_per_param;
  const double c1 = priced(cb), c2 = priced(cs);
  // t = fixed + c / efficiency through both points. A fit that makes the
  // fixed part negative (a size that runs relatively slower), or more than
  // half the smaller size's time (noise: no per-call cost is that large),
  // is measured again, up to 3 times (every rank gets the same medians, so
  // all decide alike); if none holds, the config's size is kept exact with
  // no fixed part, which prices shorter rank shares (cp) fast.
  for (int attempt = 0; attempt < 3; ++attempt) {
    const auto [s1, s2] = alternate_step_medians(world, cb, cs, budget);
    fit.step_s = s1;
    const double t1 = std::max(s1 - update, 1e-9), t2 = std::max(s2 - update, 1e-9);
    const double slope = (t1 - t2) / (c1 - c2), fixed = t1 - slope * c1;
    fit.efficiency = c1 / t1;
    fit.layer_overhead_s = 0;
    if (slope > 0 && fixed >= 0 && fixed <= 0.5 * std::min(t1, t2)) {
      fit.efficiency = 1 / slope;
      fit.layer_overhead_s = fixed / (double(cfg.data.num_microbatches) * cfg.model.n_layers);
      break;
    }
  }
  return fit;
}

// The node's and the network's links (point to point from rank 0 to a rank
// on its node and one on another), and the node's all-reduce rate.
void measure_links(Communicator& world, const std::vector<int>& node_of, const Config& cfg,
                   const std::vector<bool>& node_ranks, double seconds, MachineProfile& m) {
  const int n = world.size();
  const int per_node = int(std::count(node_of.begin(), node_of.end(), node_of[0]));
  const size_t big = size_t(cfg.data.micro_batch_size) * cfg.data.seq_len * cfg.model.d_model * 4;
  if (n > 1) {
    const int same = node_of[1] == node_of[0] ? 1 : -1;
    m.node = same > 0 ? measure_link(world, 0, 1, big, seconds) : Link{};
    int other = -1;
    for (int i = 1; i < n && other < 0; ++i)
      if (node_of[size_t(i)] != node_of[0]) other = i;
    m.network = other > 0 ? measure_link(world, 0, other, big, seconds) : m.node;
    if (same < 0) m.node = m.network;
  } else {
    m.node = m.network = Link{1e10, 1e-6};
    m.source += "; one rank: links not measured";
  }
  const bool one_node = n > 1 && per_node == n;
  if (one_node) m.source += "; one node: network copied from the node link";
  if (per_node >= 2) {
    m.node.collective_Bps =
        allreduce_bus_Bps(world, node_ranks, gradient_reduction_bytes(cfg), seconds);
    if (one_node) m.network.collective_Bps = m.node.collective_Bps;
  }
}

}  // namespace

MachineProfile calibrate_machine(Communicator& world, const std::vector<int>& node_of,
                                 const Config& cfg, const CalibrationOptions& opt) {
  const int n = world.size();
  const int per_node = int(std::count(node_of.begin(), node_of.end(), node_of[0]));
  const Rates r = measure_compute(world, node_of, cfg, opt.seconds);
  MachineProfile m;
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  m.name = std::string("calibrated on ") + host;
  m.gemm_flops = r.gemm;
  m.attention_flops = r.attention;
  m.memory_Bps = r.memory;
  m.cores_per_node = r.cores < per_node ? r.cores : 0;
  // With the node oversubscribed, what its ranks ran at once against its
  // cores is what time-slicing keeps, unless the node was busy (then that
  // ratio measures the other jobs and is not used).
  const bool busy = r.ranks_at_once < r.cores - 0.5;
  if (m.cores_per_node > 0) {
    m.wait_core_share = r.wait_core_share;
    if (!busy) m.time_slice_efficiency = std::clamp(r.ranks_at_once / r.cores, 0.01, 1.0);
  }
  char sharing[160];
  std::snprintf(sharing, sizeof sharing,
                "; %.2f ranks ran at once, a waiting rank took %.3f of a core (medians of %d "
                "rounds)",
                r.ranks_at_once, r.wait_core_share, r.rounds);
  m.source = std::string("trident plan --calibrate, ") + std::to_string(n) + " ranks (" +
             std::to_string(per_node) + " per node), " + when + sharing;
  if (busy)
    m.source +=
        "; the node was busy (fewer ranks ran at once than it has cores): rates measured "
        "now may be low, calibrate again on an idle node";
  // The ranks of node 0 that run at once: as many as it has cores.
  const std::vector<bool> node_ranks = first_ranks_of_node0(node_of, std::min(per_node, r.cores));
  const ModelFit fit = fit_model(world, cfg, m, node_ranks, opt.seconds);
  m.efficiency = fit.efficiency;
  m.layer_overhead_s = fit.layer_overhead_s;
  m.optimizer_s_per_param = fit.optimizer_s_per_param;
  m.step_overhead_s = step_overhead_seconds(cfg, m, fit.step_s);
  // Every rank of a mesh updates at the same time as the others of its node.
  m.optimizer_s_per_param = fit.optimizer_together_s_per_param;
  m.collective_round_s = collective_round_seconds(world) / m.oversubscription(per_node);
  m.calibrated_tokens = double(cfg.data.micro_batch_size) * double(cfg.data.seq_len);
  m.memory_bytes = host_memory_bytes() / per_node;
  measure_links(world, node_of, cfg, node_ranks, opt.seconds, m);
  m.nvlink = m.node;  // a CPU node has no NVLink: its domain is the node's shared memory
  const ExchangeCosts ex = exchange_costs(world, cfg, m.node, m.oversubscription(per_node));
  m.ring_step_s = ex.ring_step_s;
  m.alltoall_s = ex.alltoall_s;
  return m;
}

}  // namespace trident::plan
