// Mesh search: enumerate, check legality, price, bound, simulate the
// promising ones (see search.hpp).
#include "trident/plan/search.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <queue>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/parallel/cp/config_rules.hpp"
#include "trident/plan/packed_attention.hpp"
#include "trident/train/check_config.hpp"

namespace trident::plan {
namespace {

struct Candidate {
  MeshPlan plan;
  double lower_bound = 0;
};

// Every (schedule, vpp) worth trying for pp pipeline ranks.
std::vector<std::pair<PipelineSchedule, int>> schedules_for(int pp, int n_layers) {
  if (pp == 1) return {{PipelineSchedule::one_f_one_b, 1}};  // all schedules coincide
  std::vector<std::pair<PipelineSchedule, int>> out = {{PipelineSchedule::afab, 1},
                                                       {PipelineSchedule::one_f_one_b, 1},
                                                       {PipelineSchedule::zb_h1, 1}};
  for (int v = 2; v * pp <= n_layers && v <= 8; ++v)
    out.push_back({PipelineSchedule::interleaved, v});
  if (2 * pp <= n_layers) {  // the V placement: two chunks per rank
    out.push_back({PipelineSchedule::zb_v, 2});
    out.push_back({PipelineSchedule::dualpipev, 2});
  }
  return out;
}

// How a cp group of `cp` ranks can split: ring and ulysses inside a domain;
// hybrid where ring and ulysses cannot serve cp (it crosses a domain, or
// n_heads does not split over cp), with its Ulysses groups inside one and
// the ring across, the largest Ulysses group the domain and the heads allow:
// a larger u puts more of the group on the fast link and makes each ring
// step u times longer for the same block, while the all-to-all's share
// (u-1)/u barely grows. Empty: cp cannot be laid out.
std::vector<std::pair<CpMode, int>> cp_modes(const Config& cfg, const ClusterShape& shape, int cp) {
  std::vector<std::pair<CpMode, int>> modes;
  const auto heads_split = [&](int u) {
    return cp::heads_rule_broken(cfg.model.n_heads, cfg.model.n_kv_heads, u).empty();
  };
  const bool fits = shape.nvlink_domain % cp == 0;
  if (fits) {
    modes.push_back({CpMode::ring, 1});
    if (cp > 1) modes.push_back({CpMode::ulysses, cp});
  }
  if (fits && heads_split(cp)) return modes;
  int best_u = 0;
  for (int u : divisors(std::gcd(cp, shape.nvlink_domain)))
    if (u > 1 && u < cp && heads_split(u)) best_u = u;
  if (best_u > 0) modes.push_back({CpMode::hybrid, best_u});
  return modes;
}

// Packed documents: each (ring, layout)'s imbalance, simulated once.
class PackedPricer {
 public:
  explicit PackedPricer(const Config& cfg)
      : cfg_(cfg),
        packed_(cfg.data.packing == Packing::documents && !cfg.doc_lengths_log2.empty()) {}
  MeshPlan operator()(MeshPlan p) {
    const std::pair<int, CpLayout> key{p.cp_ring(), p.cp_layout};
    if (!packed_ || key.first <= 1) return p;
    auto it = imbalance_.find(key);
    if (it == imbalance_.end())
      it = imbalance_
               .emplace(key, packed_layout_imbalance(cfg_.doc_lengths_log2, cfg_.data.seq_len,
                                                     key.first, key.second, cfg_.model.window))
               .first;
    p.packed_imbalance = it->second;
    return p;
  }

 private:
  const Config& cfg_;
  bool packed_;
  std::map<std::pair<int, CpLayout>, double> imbalance_;
};

// Whether a cp layout applies to a mode: the layout splits the ring only
// (a group with no ring keeps the config's), and the document layout is the
// plain ring's alone (cp/config_rules).
bool layout_applies(const Config& cfg, int cp, std::pair<CpMode, int> mode, CpLayout layout) {
  if (cp / mode.second == 1 && layout != cfg.parallel.cp_layout) return false;
  return layout != CpLayout::docs || mode.first == CpMode::ring;
}

// The plans of one (pp, cp, ep): every schedule, cp mode and layout.
void add_plans(const Config& cfg, std::array<int, 4> pp_cp_ep_dp,
               const std::vector<std::pair<CpMode, int>>& modes,
               const std::vector<CpLayout>& layouts, PackedPricer& priced,
               std::vector<MeshPlan>& out) {
  const auto [pp, cp, ep, dp] = pp_cp_ep_dp;
  for (auto [sched, vpp] : schedules_for(pp, cfg.model.n_layers))
    for (auto mode : modes)
      for (CpLayout layout : layouts) {
        if (!layout_applies(cfg, cp, mode, layout)) continue;
        MeshPlan p;
        p.pp = pp, p.cp = cp, p.ep = ep, p.vpp = vpp, p.dp = dp;
        p.schedule = sched, p.cp_layout = layout;
        p.cp_mode = mode.first, p.cp_ulysses = mode.second;
        // the config's layout on its own pipeline, the even split on others
        if (pp == cfg.parallel.pp && vpp == cfg.parallel.vpp) p.pp_layout = cfg.parallel.pp_layout;
        p.grad_bucket_mb = cfg.train.grad_bucket_mb;
        out.push_back(priced(p));
      }
}

// The meshes (pp, cp, ep) and schedules, before the batch split.
std::vector<MeshPlan> meshes(const Config& cfg, const ClusterShape& shape) {
  std::vector<MeshPlan> out;
  PackedPricer priced(cfg);
  // Packed documents: also the layout laid out by each sequence's documents.
  std::vector<CpLayout> layouts = {CpLayout::zigzag, CpLayout::contiguous};
  if (cfg.data.packing == Packing::documents) layouts.push_back(CpLayout::docs);
  const long long world = shape.world();
  for (int pp : divisors(world)) {
    if (pp > cfg.model.n_layers) break;
    const long long stage = world / pp;
    for (int cp : divisors(stage)) {
      const auto modes = cp_modes(cfg, shape, cp);
      if (modes.empty()) continue;
      for (int ep : divisors(stage)) {
        if (cfg.model.n_experts == 0 ? ep > 1 : cfg.model.n_experts % ep != 0) continue;
        add_plans(cfg, {pp, cp, ep, int(stage / cp)}, modes, layouts, priced, out);
      }
    }
  }
  return out;
}

}  // namespace

std::string plan_refusal(const Config& cfg, const ClusterShape& shape, const MeshPlan& plan) {
  const MeshCheck mc = check_mesh(shape,
                                  {plan.pp, plan.cp, plan.ep, plan.cp_mode,
                                   plan.cp_mode == CpMode::hybrid ? plan.cp_ulysses : 0},
                                  cfg.model.n_experts);
  if (!mc.ok()) return mc.key + ": " + mc.rule;
  if (1LL * plan.pp * plan.cp * plan.dp != shape.world()) return "pp*cp*dp must be the world size";
  try {
    train::check_config(with_plan(cfg, plan), shape.world());
  } catch (const InputError& e) {
    return e.what();
  }
  return {};
}

namespace {

// Memory no schedule can go below: every rank holds one micro-batch's cache.
double least_memory(const Config& cfg, const MeshPlan& p) {
  return std::max(memory_lower_bound(cfg, p, 0).total(),
                  memory_lower_bound(cfg, p, p.pp - 1).total());
}

long long default_global_batch(const Config& cfg, const ClusterShape& shape) {
  const long long world = shape.world(), pc = 1LL * cfg.parallel.pp * cfg.parallel.cp;
  if (world % pc != 0)
    throw InputError("--global-batch: needed, because the config's pp*cp = " + std::to_string(pc) +
                     " does not divide " + std::to_string(world) + " ranks");
  return 1LL * cfg.data.micro_batch_size * cfg.data.num_microbatches * (world / pc);
}

// Distance of a plan's tokens per micro-batch and rank from the shape the
// profile was calibrated at (its predictions extrapolate least there).
double calibration_distance(const Config& cfg, const MeshPlan& p, const MachineProfile& m) {
  if (m.calibrated_tokens <= 0) return 0;
  const double tokens = double(p.micro_batch_size) * double(cfg.data.seq_len) / p.cp;
  return std::abs(std::log(tokens / m.calibrated_tokens));
}

// The k best: by step time, then within a tie (steps within kStepTie of the
// first of the run of ties) nearest the calibrated shape, then by memory.
std::vector<Prediction> rank_predictions(std::vector<Prediction> all, size_t k, const Config& cfg,
                                         const MachineProfile& m) {
  std::stable_sort(all.begin(), all.end(), [](const Prediction& a, const Prediction& b) {
    return a.step_time_s < b.step_time_s;
  });
  auto closer = [&](const Prediction& a, const Prediction& b) {
    const double da = calibration_distance(cfg, a.plan, m),
                 db = calibration_distance(cfg, b.plan, m);
    if (da != db) return da < db;
    return a.memory.total() < b.memory.total();
  };
  for (size_t i = 0; i < all.size();) {
    size_t j = i + 1;
    while (j < all.size() && all[j].step_time_s <= all[i].step_time_s * (1 + kStepTie)) ++j;
    std::stable_sort(all.begin() + long(i), all.begin() + long(j), closer);
    i = j;
  }
  if (all.size() > k) all.resize(k);
  return all;
}

// The memory policies of a mesh, from the least memory saved to the most:
// the sharded optimizer wherever a parameter has replicas (the model prices
// its reduce-scatter and all-gather as the all-reduce they replace, and it
// updates 1/replicas of the parameters, so it is never slower), then
// selective recompute, then full. Each rung keeps less and costs at least as
// much time as the one before, so a mesh's first rung that fits is its best.
std::optional<MeshPlan> next_policy(MeshPlan p) {
  if (p.recompute == Recompute::full) return std::nullopt;
  p.recompute = p.recompute == Recompute::none ? Recompute::selective : Recompute::full;
  p.recompute_layers = 0;
  return p;
}

MeshPlan first_policy(MeshPlan p) {
  p.recompute = Recompute::none, p.recompute_layers = 0;
  p.sharding = p.dp * p.cp > 1 ? OptimizerSharding::dp : OptimizerSharding::none;
  return p;
}

// The first policy from `p` up whose least memory fits, with its bound.
std::optional<Candidate> fitting_candidate(const Config& cfg, const ClusterShape& shape,
                                           const MachineProfile& m, const SearchOptions& opt,
                                           std::optional<MeshPlan> p) {
  for (; p; p = next_policy(*p))
    if (opt.memory_limit_bytes <= 0 || least_memory(cfg, *p) <= opt.memory_limit_bytes)
      return Candidate{*p, action_times(cfg, *p, shape, m).lower_bound_s()};
  return std::nullopt;
}

// Legal candidates with their step-time bounds; counts go into r.
std::vector<Candidate> legal_candidates(const Config& cfg, const ClusterShape& shape,
                                        const MachineProfile& m, const SearchOptions& opt,
                                        SearchResult& r) {
  std::vector<Candidate> out;
  for (MeshPlan p : meshes(cfg, shape)) {
    if (r.global_batch % p.dp) continue;
    for (int mbs : divisors(r.global_batch / p.dp)) {
      p.micro_batch_size = mbs;
      p.microbatches = int(r.global_batch / p.dp / mbs);
      ++r.candidates;
      if (!plan_refusal(cfg, shape, p).empty()) continue;
      ++r.legal;
      if (std::optional<Candidate> c = fitting_candidate(cfg, shape, m, opt, first_policy(p)))
        out.push_back(*c);
      else
        ++r.refused_memory;
    }
  }
  return out;
}

}  // namespace

SearchResult search(const Config& cfg, const ClusterShape& shape, const MachineProfile& m,
                    const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult r;
  r.global_batch = opt.global_batch > 0 ? opt.global_batch : default_global_batch(cfg, shape);
  std::vector<Candidate> cands = legal_candidates(cfg, shape, m, opt, r);
  auto later = [](const Candidate& a, const Candidate& b) { return a.lower_bound > b.lower_bound; };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later,
                                                                                std::move(cands));
  const size_t k = size_t(std::max(1, opt.top_k));
  // Simulate in the order of the bounds until none can come within the tie
  // margin of the k-th best step; a mesh refused for memory comes back with
  // its next policy.
  std::vector<Prediction> fits;
  std::vector<double> steps;  // the fitting predictions' steps, ascending
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    if (steps.size() >= k && c.lower_bound > steps[k - 1] * (1 + kStepTie)) break;
    Prediction p = predict(cfg, c.plan, shape, m, false);
    ++r.simulated;
    if (opt.memory_limit_bytes > 0 && p.memory.total() > opt.memory_limit_bytes) {
      if (std::optional<Candidate> n = fitting_candidate(cfg, shape, m, opt, next_policy(c.plan)))
        queue.push(*n);
      else
        ++r.refused_memory;
      continue;
    }
    steps.insert(std::upper_bound(steps.begin(), steps.end(), p.step_time_s), p.step_time_s);
    fits.push_back(std::move(p));
  }
  r.best = rank_predictions(std::move(fits), k, cfg, m);
  if (r.best.empty()) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.3f GB", opt.memory_limit_bytes / 1e9);
    throw InputError("--search: no legal mesh of " + std::to_string(shape.world()) + " ranks " +
                     (r.legal == 0
                          ? std::string("for a global batch of ") + std::to_string(r.global_batch) +
                                " sequences (" + std::to_string(r.candidates) +
                                " candidates, none legal)"
                          : "fits --memory-gb " + std::string(buf) + " (" +
                                std::to_string(r.legal) + " legal meshes, all too large)"));
  }
  for (Prediction& p : r.best) {
    p = predict(cfg, p.plan, shape, m, true);
    add_policy_effects(cfg, shape, m, opt.memory_limit_bytes, p);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string search_text(const SearchResult& r, double limit) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line,
                "search: %lld candidates, %lld legal, %lld refused for memory, %lld simulated, "
                "global batch %lld sequences, %.2f s\n",
                r.candidates, r.legal, r.refused_memory, r.simulated, r.global_batch, r.seconds);
  o << line;
  o << "rank  step_s      tokens/s    bubble  memory_GB  mesh\n";
  for (size_t i = 0; i < r.best.size(); ++i) {
    const Prediction& p = r.best[i];
    std::snprintf(line, sizeof line, "%4zu  %-10.4g  %-10.4g  %5.1f%%  %9.3f  %s\n", i + 1,
                  p.step_time_s, p.tokens_per_s, 100 * p.bubble_fraction, p.memory.total() / 1e9,
                  p.plan.str().c_str());
    o << line;
  }
  if (!r.best.empty()) o << "\nfirst choice:\n" << prediction_text(r.best.front(), limit);
  return o.str();
}

std::string search_json(const SearchResult& r) {
  std::ostringstream o;
  o.precision(9);
  o << "{\"candidates\": " << r.candidates << ", \"legal\": " << r.legal
    << ", \"refused_memory\": " << r.refused_memory << ", \"simulated\": " << r.simulated
    << ", \"global_batch\": " << r.global_batch << ", \"seconds\": " << r.seconds
    << ", \"best\": [";
  for (size_t i = 0; i < r.best.size(); ++i) o << (i ? ", " : "") << prediction_json(r.best[i]);
  o << "]}\n";
  return o.str();
}

}  // namespace trident::plan
