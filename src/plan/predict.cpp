// Prediction of one mesh: cost model -> seconds per action -> schedule
// simulator -> step time, split and memory (see predict.hpp).
#include "trident/plan/predict.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "trident/model/flops.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/parallel/pp/simulator.hpp"

namespace trident::plan {
namespace {

constexpr double kAdamWBytesPerParam = 36;  // read p g m v, write p m v, zero g, norm reads g
constexpr int kStepAgreements = 6;          // loss, grad norm, step span, bubble, comm bytes, clock

LinkClass class_of(const ClusterShape& s, long long a, long long b) {
  if (a / s.devices_per_node != b / s.devices_per_node) return LinkClass::network;
  if (a / s.nvlink_domain != b / s.nvlink_domain) return LinkClass::node;
  return LinkClass::nvlink;
}
// An aligned run of n ranks starting at 0 spans the class of its ends.
LinkClass span_class(const ClusterShape& s, long long n) { return class_of(s, 0, n - 1); }

LinkClass worst(LinkClass a, LinkClass b) { return int(a) > int(b) ? a : b; }

LinkClass pp_class(const ClusterShape& s, const MeshPlan& p) {
  LinkClass c = LinkClass::nvlink;
  const long long stage = 1LL * p.dp * p.cp;
  for (int i = 0; i + 1 < p.pp && c != LinkClass::network; ++i)
    c = worst(c, class_of(s, i * stage, (i + 1) * stage));
  return c;
}

// Ring allreduce of `bytes` over n ranks; sharded (ZeRO-1), a reduce-scatter
// and an all-gather of the same bytes: the same ring steps in two calls.
double allreduce_s(const Link& l, double bytes, long long n) {
  if (n <= 1 || bytes <= 0) return 0;  // no call (a model without experts)
  return 2.0 * (n - 1) * l.latency_s + 2.0 * (n - 1) / n * bytes / l.reduction_Bps();
}

// The link of a collective over the group of every stride-th rank of `span`
// consecutive ranks. Across nodes NCCL runs one ring per NIC, each crossing
// on its own rail: with g of the group's ranks on each node and k = min(g,
// rails) rails, a ring's node-crossing hop carries 1/k of the bytes, and the
// g-1 hops inside the node the rest over the node's own link, so a rank's
// share is 1 / max(1 / (k * network), (g - 1) / (g * inside)).
Link collective_link(const ClusterShape& s, const MachineProfile& m, long long span, int stride) {
  const LinkClass c = span_class(s, span);
  Link l = m.link(c);
  if (c != LinkClass::network) return l;
  const double g = double(std::min<long long>(span, s.devices_per_node)) / stride;
  const double k = std::max(1.0, std::min(g, m.network_rails));
  if (k <= 1) return l;
  const Link& inside = m.link(span_class(s, std::min<long long>(span, s.devices_per_node)));
  const double per_byte =
      std::max(1 / (k * m.network.reduction_Bps()), (g - 1) / (g * inside.reduction_Bps()));
  l.bandwidth_Bps = 1 / per_byte;
  l.collective_Bps = 0;
  return l;
}

// Exposed seconds of the CP ring in one action: each step's transfer hides
// behind that step's share of the attention kernel.
double ring_exposed(const MachineProfile& m, const Link& l, const ActionComm& c, double attn_flops,
                    int cp) {
  if (c.cp_steps == 0) return 0;
  const double per_step_comm = l.seconds((c.cp_bytes - c.cp_tail_bytes) / c.cp_steps);
  const double per_step_compute = m.ring_overlap * compute_seconds(Work{0, attn_flops, 0}, m) / cp /
                                  (double(c.cp_steps) / (cp - 1));
  // each step, and the trip home, also waits as a blocking exchange does
  return c.cp_steps * std::max(0.0, per_step_comm - per_step_compute) +
         l.seconds(c.cp_tail_bytes, c.cp_tail_messages) +
         (c.cp_steps + c.cp_tail_messages) * m.ring_step_s;
}

// `calls` all-to-alls over `peers` ranks moving `bytes` in all: a message
// to each other peer per call, the measured cost of a blocking exchange per
// call, and the bytes at the link's rate.
double all_to_all_calls_s(const MachineProfile& m, const Link& l, double calls, int peers,
                          double bytes) {
  if (calls == 0) return 0;
  return calls * ((peers - 1) * l.latency_s + m.alltoall_s) + bytes / l.bandwidth_Bps;
}

// The Ulysses all-to-alls of one action over its u ranks: nothing to hide
// them behind (the attention needs all their data), so every byte and
// message is exposed.
double alltoall_s(const MachineProfile& m, const Link& l, const ActionComm& c, int u) {
  return all_to_all_calls_s(m, l, c.a2a_calls, u, c.a2a_bytes);
}

// The MoE dispatch and combine over ep ranks; the busiest rank's bytes are
// `imbalance` times the mean.
double exchange_s(const MachineProfile& m, const Link& l, const ActionComm& c, int ep,
                  double imbalance) {
  return all_to_all_calls_s(m, l, c.ep_exchanges, ep, imbalance * c.ep_bytes);
}

// Which schedule ranks share a node's cores, and how many of the node's ranks
// each stands for: a node holds whole dp x cp groups of consecutive pipeline
// ranks, or part of one group (pp is the outermost mesh dimension).
CoreSharing core_sharing_of(const ClusterShape& shape, const MeshPlan& p, const MachineProfile& m) {
  CoreSharing cs;
  const long long group = 1LL * p.dp * p.cp, per_node = shape.devices_per_node;
  cs.cores = m.cores_per_node > 0 ? m.cores_per_node : double(per_node);
  if (m.cores_per_node > 0 && per_node > m.cores_per_node) {
    cs.time_slice_efficiency = m.time_slice_efficiency;
    cs.waiting_share = m.wait_core_share;
  }
  for (int r = 0; r < p.pp; ++r) {
    cs.node.push_back(group >= per_node ? r : int(r * group / per_node));
    cs.weight.push_back(double(std::min(group, per_node)));
  }
  return cs;
}

// Compute of one step on the busiest node over its cores: no schedule makes
// ranks that share cores finish sooner.
double node_work_s(const ActionTimes& a, const pp::Placement& place) {
  std::vector<double> node(a.cores.node.size(), 0.0);
  for (size_t vs = 0; vs < a.stages.size(); ++vs) {
    const size_t r = size_t(place.rank[vs]);
    const StageTimes& t = a.stages[vs];
    node[size_t(a.cores.node[r])] += a.cores.weight[r] * a.microbatches * (t.f + t.b + t.w);
  }
  return *std::max_element(node.begin(), node.end()) / a.cores.cores;
}

// The step's small all-reduces (loss, norm, span, bubble, comm bytes, clock,
// one per MoE layer): a measured round where the profile has one (on shared
// cores their time is the ranks' turns, not the link's), else two latencies
// of the world's link per round; ceil(log2 world) rounds each.
double agreements_s(const Config& cfg, const ClusterShape& shape, const MachineProfile& m,
                    long long world) {
  if (world <= 1) return 0;
  int moe_layers = 0;
  for (int l = 0; l < cfg.model.n_layers; ++l) moe_layers += cfg.model.is_moe_layer(l) ? 1 : 0;
  const double rounds = std::ceil(std::log2(double(world)));
  const double per_round = m.collective_round_s > 0
                               ? m.collective_round_s
                               : 2 * m.link(span_class(shape, world)).latency_s;
  return (kStepAgreements + moe_layers) * rounds * per_round;
}

// train.grad_bucket_mb > 0: each bucket's reduction is posted once its
// gradients are final, which for every bucket but the ones of the rank's
// first layers is during the last micro-batch's backward through the rank's
// chunks (`backward_s`, the shortest over the ranks). That much of the
// reduction hides behind it, and never the last bucket's share (posted as the
// backward ends). Where the ranks outnumber the cores (sharing > 1) the
// reduction's copies take the cores the backward needs, and nothing hides:
// measured, memory.md.
double exposed_dp_s(const MeshPlan& p, double dp_s, double grad_bytes, double sharing,
                    double backward_s) {
  if (p.grad_bucket_mb <= 0 || dp_s <= 0 || sharing > 1 || grad_bytes <= 0) return dp_s;
  const double buckets = std::max(1.0, std::ceil(grad_bytes / (p.grad_bucket_mb * 1048576.0)));
  return std::max(dp_s / buckets, dp_s - backward_s);
}

// One micro-batch through each rank's chunks: the busiest rank's F + B + W
// into a.busiest_rank_s; returns the shortest rank's B + W (its backward).
double rank_times(ActionTimes& a, const MeshPlan& p, const pp::Placement& place) {
  std::vector<double> work(size_t(p.pp), 0), backward(size_t(p.pp), 0);
  for (size_t vs = 0; vs < a.stages.size(); ++vs) {
    const StageTimes& t = a.stages[vs];
    work[size_t(place.rank[vs])] += t.f + t.b + t.w;
    backward[size_t(place.rank[vs])] += t.b + t.w;
  }
  a.busiest_rank_s = *std::max_element(work.begin(), work.end());
  return *std::min_element(backward.begin(), backward.end());
}

}  // namespace

double optimizer_seconds(const MachineProfile& m, double params) {
  return m.optimizer_s_per_param > 0 ? params * m.optimizer_s_per_param
                                     : kAdamWBytesPerParam * params / m.memory_Bps;
}

double compute_seconds(const Work& w, const MachineProfile& m) {
  return (w.gemm_flops / m.gemm_flops + w.attention_flops / m.attention_flops +
          w.memory_bytes / m.memory_Bps) /
         m.efficiency;
}

double ActionTimes::lower_bound_s() const {
  return std::max(microbatches * busiest_rank_s, cpu_bound_s()) + after_pipeline;
}

std::vector<double> ActionTimes::stage_work() const {
  const double slowest = t_f + t_b + t_w;
  std::vector<double> out;
  for (const StageTimes& s : stages) out.push_back(slowest > 0 ? (s.f + s.b + s.w) / slowest : 1);
  return out;
}

ActionTimes action_times(const Config& cfg, const MeshPlan& p, const ClusterShape& shape,
                         const MachineProfile& m) {
  // Actions run at the rates of a rank alone: ranks that wait yield their
  // core, so how much the ranks of a node slow each other down is decided
  // over the whole pipeline (predict), not per action. Everything after the
  // pipeline runs on every rank at once.
  const double sharing = m.oversubscription(shape.devices_per_node);
  // The ring spans the whole cp group; the Ulysses groups only u ranks.
  const Link& cp_link = m.link(span_class(shape, p.cp));
  const Link& a2a_link = m.link(span_class(shape, p.cp_ulysses));
  const Link& ep_link = m.link(span_class(shape, p.ep));
  const double T = double(p.micro_batch_size) * cfg.data.seq_len / p.cp;
  const double imb = cfg.model.n_experts > 0 ? moe_imbalance(T * cfg.model.top_k * p.ep, p.ep) : 1;
  ActionTimes a;
  a.moe_imbalance = imb;
  a.microbatches = p.microbatches;
  a.vpp = p.vpp;
  double max_params = 0, dense_grad = 0, expert_grad = 0;
  std::vector<double> rank_params(size_t(p.pp), 0), rank_expert(size_t(p.pp), 0);
  const pp::Placement place = placement_of(p);
  for (int vs = 0; vs < p.pp * p.vpp; ++vs) {
    const ChunkCost c = chunk_cost(cfg, p, vs);
    const int r = p.cp_ring(), u = p.cp_ulysses;
    const double cp_f = ring_exposed(m, cp_link, c.f_comm, c.f.attention_flops, r) +
                        alltoall_s(m, a2a_link, c.f_comm, u);
    const double cp_b = ring_exposed(m, cp_link, c.b_comm, c.b.attention_flops, r) +
                        alltoall_s(m, a2a_link, c.b_comm, u);
    const double ep_f = exchange_s(m, ep_link, c.f_comm, p.ep, imb);
    const double ep_b = exchange_s(m, ep_link, c.b_comm, p.ep, imb);
    // the fixed cost of the chunk's layers: a third in F, the rest in B
    // (backward makes about twice the forward's kernel calls)
    const double fixed = m.layer_overhead_s * c.layers;
    const double f = compute_seconds(c.f, m) + fixed / 3 + cp_f + ep_f,
                 b = compute_seconds(c.b, m) + 2 * fixed / 3 + cp_b + ep_b,
                 w = compute_seconds(c.w, m);
    a.stages.push_back({f, b, w});
    if (f + b + w > a.t_f + a.t_b + a.t_w) {  // the slowest stage sets the pace
      a.t_f = f, a.t_b = b, a.t_w = w;
      a.e_f = ep_f, a.e_b = ep_b;
      a.compute = p.vpp * (compute_seconds(c.f, m) + compute_seconds(c.b, m) +
                           compute_seconds(c.w, m) + fixed);
      a.cp = p.vpp * (cp_f + cp_b);
      a.ep = p.vpp * (ep_f + ep_b);
    }
    rank_params[size_t(place.rank[size_t(vs)])] += c.params;
    rank_expert[size_t(place.rank[size_t(vs)])] += c.expert_params;
    if (vs == 0) a.latency = m.link(pp_class(shape, p)).seconds(c.boundary_bytes);
  }
  double updated = 0;  // parameters the busiest rank updates (its shards when sharded)
  const long long replicas = 1LL * p.dp * p.cp;
  for (int i = 0; i < p.pp; ++i) {
    if (rank_params[size_t(i)] <= max_params) continue;
    max_params = rank_params[size_t(i)];
    expert_grad = 4 * rank_expert[size_t(i)];
    dense_grad = 4 * (rank_params[size_t(i)] - rank_expert[size_t(i)]);
    updated = p.sharding == OptimizerSharding::dp
                  ? dense_grad / 4 / double(replicas) + expert_grad / 4 / double(replicas / p.ep)
                  : max_params;
  }
  const long long stage = 1LL * p.dp * p.cp;
  const Link dp_link = collective_link(shape, m, stage, 1);
  const Link expert_link = collective_link(shape, m, stage, p.ep);
  a.sharing = sharing;
  a.cores = core_sharing_of(shape, p, m);
  if (sharing > 1) a.node_work_s = node_work_s(a, place);
  a.dp = sharing * (allreduce_s(dp_link, dense_grad, stage) +
                    allreduce_s(expert_link, expert_grad, stage / p.ep));
  a.dp_total = a.dp;
  a.dp = exposed_dp_s(p, a.dp, dense_grad + expert_grad, sharing, rank_times(a, p, place));
  const long long world = stage * p.pp;
  const double agreements = agreements_s(cfg, shape, m, world);
  a.after_pipeline =
      a.dp + sharing * (agreements + optimizer_seconds(m, updated)) + m.step_overhead_s;
  return a;
}

namespace {

// FLOPs of one step's model math (model/flops.hpp: the formula bench step
// shares).
double model_flops_per_step(const Config& cfg, const MeshPlan& p) {
  return model::step_model_flops(cfg, double(p.global_batch()));
}

// What the overlapped slots hide: the makespan with them run serially less
// `makespan` (0 when nothing is hidden; one more simulation otherwise).
double ep_hidden_seconds(const pp::Schedule& lowered, pp::SimCosts costs,
                         const std::vector<double>& work, double makespan) {
  if (!costs.overlap_pairs || (costs.e_f <= 0 && costs.e_b <= 0)) return 0;
  bool any = false;
  for (const auto& row : lowered.ranks)
    for (const pp::Action& x : row) any = any || x.overlapped;
  if (!any) return 0;
  costs.overlap_pairs = false;
  return std::max(0.0, pp::simulate(lowered, costs, work).makespan - makespan);
}

pp::Schedule lowered_schedule(const MeshPlan& p) {
  return pp::lower(pp::make_schedule(p.schedule, p.pp, p.microbatches, p.vpp));
}

}  // namespace

Prediction predict(const Config& cfg, const MeshPlan& p, const ClusterShape& shape,
                   const MachineProfile& m, bool detailed) {
  const ActionTimes a = action_times(cfg, p, shape, m);
  pp::SimCosts costs{a.t_f, a.t_b, a.t_w, a.latency};
  costs.e_f = a.e_f, costs.e_b = a.e_b, costs.overlap_pairs = cfg.runtime.ep_overlap;
  const pp::Schedule lowered = lowered_schedule(p);
  // each virtual stage at its own cost (its layers, the embedding and the
  // head), in units of the slowest stage's
  const std::vector<double> work = a.stage_work();
  const pp::SimResult sim = pp::simulate(lowered, costs, work);
  Prediction out;
  out.plan = p;
  out.t_f = a.t_f, out.t_b = a.t_b, out.t_w = a.t_w, out.pp_latency_s = a.latency;
  out.moe_imbalance = a.moe_imbalance;
  // Ranks sharing cores: replay the schedule with the cores shared by the
  // ranks that have work at each moment.
  double pipeline = sim.makespan;
  if (a.sharing > 1)
    pipeline =
        std::max(pipeline, simulate_shared_cores(lowered, a.stages, a.latency, a.cores).makespan);
  out.split.cores = pipeline - sim.makespan;
  out.step_time_s = pipeline + a.after_pipeline;
  out.tokens_per_s = double(p.global_batch()) * cfg.data.seq_len / out.step_time_s;
  out.bubble_fraction = sim.mean_bubble();
  out.model_flops = model_flops_per_step(cfg, p);
  const double world = double(p.pp) * p.dp * p.cp;
  out.mfu = m.peak_flops > 0 ? out.model_flops / (out.step_time_s * world * m.peak_flops) : 0;
  out.ep_hidden_s = ep_hidden_seconds(lowered, costs, work, sim.makespan);
  const double busy = p.microbatches * (a.compute + a.cp + a.ep) - out.ep_hidden_s;
  out.split.compute = p.microbatches * a.compute;
  out.split.cp = p.microbatches * a.cp;
  out.split.ep = p.microbatches * a.ep - out.ep_hidden_s;
  out.split.dp = a.dp;
  out.dp_reduction_s = a.dp_total;
  out.split.other = a.after_pipeline - a.dp;
  double no_latency = sim.makespan;
  if (detailed && a.latency > 0) {
    costs.latency = 0;
    no_latency = pp::simulate(lowered, costs, work).makespan;
  }
  out.split.pp = sim.makespan - no_latency;
  out.split.bubble = std::max(0.0, no_latency - busy);
  for (int r = 0; r < p.pp; ++r) {
    const MemoryEstimate mem = memory_of_rank(cfg, p, r, lowered);
    out.rank_total.push_back(mem.total());
    out.rank_allocator.push_back(mem.allocator());
    out.peak_inflight = std::max(out.peak_inflight, sim.ranks[size_t(r)].peak_inflight);
    if (mem.total() > out.memory.total()) out.memory = mem, out.memory_pp_rank = r;
  }
  out.cp_link = span_class(shape, p.cp);
  out.ep_link = span_class(shape, p.ep);
  out.pp_link = pp_class(shape, p);
  out.dp_link = span_class(shape, 1LL * p.dp * p.cp);
  return out;
}

void add_policy_effects(const Config& cfg, const ClusterShape& shape, const MachineProfile& m,
                        double limit, Prediction& p) {
  p.policy_effects.clear();
  const auto fits = [&](const Prediction& q) { return limit <= 0 || q.memory.total() <= limit; };
  const auto effect = [&](const std::string& name, MeshPlan without) {
    const Prediction q = predict(cfg, without, shape, m, false);
    p.policy_effects.push_back(
        {name, p.step_time_s - q.step_time_s, p.memory.total() - q.memory.total(), fits(q)});
  };
  MeshPlan base = p.plan;
  if (p.plan.sharding != OptimizerSharding::none) {
    MeshPlan without = p.plan;
    without.sharding = OptimizerSharding::none;
    effect("sharding=" + config_name(p.plan.sharding), without);
  }
  if (p.plan.recompute != Recompute::none) {
    MeshPlan without = p.plan;
    without.recompute = Recompute::none, without.recompute_layers = 0;
    std::string name = "recompute=" + config_name(p.plan.recompute);
    if (p.plan.recompute_layers > 0) name += ":" + std::to_string(p.plan.recompute_layers);
    effect(name, without);
  }
  base.recompute = Recompute::none, base.recompute_layers = 0;
  base.sharding = OptimizerSharding::none;
  const Prediction b = predict(cfg, base, shape, m, false);
  p.baseline_step_s = b.step_time_s;
  p.baseline_memory = b.memory.total();
}

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Seconds with a unit that keeps three significant digits readable.
std::string seconds_text(double s) {
  if (s >= 1) return fmt("%.3f s", s);
  if (s >= 1e-3) return fmt("%.3f ms", s * 1e3);
  return fmt("%.1f us", s * 1e6);
}

std::string gb(double bytes) { return fmt("%.3f GB", bytes / 1e9); }

std::string join(const std::vector<double>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + fmt("%.9g", v[i]);
  return out;
}

}  // namespace

std::string prediction_text(const Prediction& p, double limit) {
  std::ostringstream o;
  const TimeSplit& s = p.split;
  const double step = p.step_time_s;
  auto part = [&](const char* name, double v) {
    return std::string(name) + " " + seconds_text(v) + " (" + fmt("%.1f", 100 * v / step) + "%)";
  };
  o << "prediction for " << p.plan.str() << "\n"
    << "  step " << seconds_text(step) << ", " << fmt("%.4g", p.tokens_per_s)
    << " tokens/s, bubble " << fmt("%.1f", 100 * p.bubble_fraction) << "%";
  if (p.mfu > 0) o << ", MFU " << fmt("%.1f", 100 * p.mfu) << "%";
  o << "\n  time: " << part("compute", s.compute) << ", " << part("bubble", s.bubble) << ", "
    << part("cp", s.cp) << ", " << part("ep", s.ep) << ", " << part("pp", s.pp) << ", "
    << part("dp", s.dp) << ", " << part("other", s.other);
  if (p.dp_reduction_s > s.dp)
    o << " (dp: " << seconds_text(p.dp_reduction_s) << " of reduction in "
      << fmt("%g", p.plan.grad_bucket_mb) << " MiB buckets, the rest behind the backward)";
  if (p.ep_hidden_s > 0)
    o << " (ep: " << seconds_text(p.ep_hidden_s)
      << " more behind the other micro-batch's compute in overlapped F+B slots)";
  if (s.cores > 0) o << ", " << part("shared cores", s.cores);
  o << "\n"
    << "  per action: F " << seconds_text(p.t_f) << ", B " << seconds_text(p.t_b) << ", W "
    << seconds_text(p.t_w) << ", stage hand-over " << seconds_text(p.pp_latency_s) << "\n"
    << "  links: cp " << link_class_name(p.cp_link) << ", ep " << link_class_name(p.ep_link)
    << ", pp " << link_class_name(p.pp_link) << ", dp " << link_class_name(p.dp_link) << "\n";
  const MemoryEstimate& m = p.memory;
  o << "  memory (pp rank " << p.memory_pp_rank << "): " << gb(m.total()) << " = params "
    << gb(m.params) << " + grads " << gb(m.grads) << " + optimizer " << gb(m.optimizer)
    << " + activations " << gb(m.activations) << " (" << p.peak_inflight << " in flight) + buffers "
    << gb(m.comm_buffers) << " + workspace " << gb(m.workspace)
    << (m.packed_weights > 0 ? " + packed bf16 weights " + gb(m.packed_weights) : "")
    << "\n        (allocator " << gb(m.allocator()) << ", outside it " << gb(m.untracked) << ")";
  if (limit > 0) o << "; limit " << gb(limit) << (m.total() <= limit ? ", fits" : ", DOES NOT FIT");
  o << "\n";
  for (const PolicyEffect& e : p.policy_effects) {
    o << "  " << e.choice << ": " << (e.memory_delta <= 0 ? "saves " : "costs ")
      << gb(std::abs(e.memory_delta)) << ", step " << (e.step_delta_s >= 0 ? "+" : "-")
      << seconds_text(std::abs(e.step_delta_s)) << " ("
      << fmt("%+.1f", 100 * e.step_delta_s / (step - e.step_delta_s)) << "%)"
      << (e.fits_without ? "" : "; without it the mesh does not fit") << "\n";
  }
  if (!p.policy_effects.empty())
    o << "  without recompute or sharding: step " << seconds_text(p.baseline_step_s) << ", memory "
      << gb(p.baseline_memory)
      << (limit > 0 ? (p.baseline_memory <= limit ? " (fits)" : " (does not fit)") : "") << "\n";
  return o.str();
}

std::string prediction_json(const Prediction& p) {
  std::ostringstream o;
  o.precision(9);
  const MeshPlan& m = p.plan;
  const TimeSplit& s = p.split;
  const MemoryEstimate& e = p.memory;
  o << "{\"pp\": " << m.pp << ", \"vpp\": " << m.vpp << ", \"cp\": " << m.cp << ", \"ep\": " << m.ep
    << ", \"dp\": " << m.dp << ", \"schedule\": \"" << config_name(m.schedule)
    << "\", \"cp_layout\": \"" << config_name(m.cp_layout) << "\", \"cp_mode\": \""
    << config_name(m.cp_mode) << "\", \"cp_ulysses\": " << m.cp_ulysses
    << ", \"cp_ring_size\": " << m.cp_ring() << ", \"micro_batch_size\": " << m.micro_batch_size
    << ", \"num_microbatches\": " << m.microbatches << ", \"step_time_s\": " << p.step_time_s
    << ", \"tokens_per_s\": " << p.tokens_per_s << ", \"bubble_fraction\": " << p.bubble_fraction
    << ", \"mfu\": " << p.mfu << ", \"t_f_s\": " << p.t_f << ", \"t_b_s\": " << p.t_b
    << ", \"t_w_s\": " << p.t_w << ", \"time_split_s\": {\"compute\": " << s.compute
    << ", \"bubble\": " << s.bubble << ", \"cp\": " << s.cp << ", \"ep\": " << s.ep
    << ", \"pp\": " << s.pp << ", \"dp\": " << s.dp << ", \"other\": " << s.other
    << ", \"cores\": " << s.cores << "}, \"memory_bytes\": {\"total\": " << e.total()
    << ", \"params\": " << e.params << ", \"grads\": " << e.grads
    << ", \"optimizer\": " << e.optimizer << ", \"activations\": " << e.activations
    << ", \"comm_buffers\": " << e.comm_buffers << ", \"workspace\": " << e.workspace
    << ", \"packed_weights\": " << e.packed_weights << ", \"allocator\": " << e.allocator()
    << ", \"untracked\": " << e.untracked << ", \"pp_rank\": " << p.memory_pp_rank
    << ", \"per_pp_rank\": {\"total\": [" << join(p.rank_total) << "], \"allocator\": ["
    << join(p.rank_allocator) << "]}}, \"peak_inflight\": " << p.peak_inflight
    << ", \"moe_imbalance\": " << p.moe_imbalance << ", \"recompute\": \""
    << config_name(m.recompute) << "\", \"recompute_layers\": " << m.recompute_layers
    << ", \"optimizer_sharding\": \"" << config_name(m.sharding)
    << "\", \"grad_bucket_mb\": " << m.grad_bucket_mb
    << ", \"dp_reduction_s\": " << p.dp_reduction_s << ", \"pp_layout\": [";
  for (size_t i = 0; i < m.pp_layout.size(); ++i) o << (i ? ", " : "") << m.pp_layout[i];
  o << "]";
  if (!p.policy_effects.empty()) {
    o << ", \"policy_effects\": [";
    for (size_t i = 0; i < p.policy_effects.size(); ++i) {
      const PolicyEffect& e = p.policy_effects[i];
      o << (i ? ", " : "") << "{\"choice\": \"" << e.choice
        << "\", \"step_time_delta_s\": " << e.step_delta_s
        << ", \"memory_delta_bytes\": " << e.memory_delta
        << ", \"fits_without\": " << (e.fits_without ? "true" : "false") << "}";
    }
    o << "], \"baseline\": {\"step_time_s\": " << p.baseline_step_s
      << ", \"memory_bytes\": " << p.baseline_memory << "}";
  }
  o << "}";
  return o.str();
}

}  // namespace trident::plan
