// Prediction: step time, time split and memory per rank of one mesh on one
// machine. The cost model's FLOPs and bytes become seconds through the
// machine profile; the pipeline schedule simulator (parallel/pp) runs the
// schedule with those per-action costs and the stage-to-stage latency; the
// gradient reduction, the step's small agreements (loss, norm, expert loads)
// and the optimizer follow it.
#pragma once
#include <string>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/plan/core_sharing.hpp"
#include "trident/plan/cost_model.hpp"
#include "trident/plan/machine.hpp"
#include "trident/topo/mesh.hpp"

namespace trident::plan {

// Where each step's time goes on the busiest rank, seconds.
struct TimeSplit {
  double compute = 0;  // F, B, W kernels
  double cp = 0;       // ring K/V not hidden behind attention
  double ep = 0;       // MoE all-to-all exchanges
  double pp = 0;       // stage-to-stage transfers on the critical path
  double bubble = 0;   // pipeline idle time
  double dp = 0;       // gradient reduction
  double other = 0;    // small agreements, optimizer, fixed overhead
  double cores = 0;    // waiting for a core: the ranks outnumber the cores they share
};

// What one memory policy of a mesh buys: the same mesh without it (the
// other policy kept) against the mesh with it.
struct PolicyEffect {
  std::string choice;        // "recompute=full", "sharding=dp"
  double step_delta_s = 0;   // step time with it minus without it
  double memory_delta = 0;   // bytes with it minus without it (< 0: saved)
  bool fits_without = true;  // whether the mesh fits the limit without it
};

struct Prediction {
  MeshPlan plan;
  double step_time_s = 0;
  double tokens_per_s = 0;
  double bubble_fraction = 0;        // simulator's mean over pipeline ranks
  double model_flops = 0;            // FLOPs of one step's model math (3 x forward)
  double mfu = 0;                    // model_flops / (step * world * peak); 0 without a peak
  double t_f = 0, t_b = 0, t_w = 0;  // seconds per action of the slowest virtual stage
  double pp_latency_s = 0;           // stage-to-stage hand-over
  int peak_inflight = 0;             // most caches alive on one rank
  // Routed rows of the busiest EP rank over the mean (the expected maximum
  // under uniform random routing; 1 without MoE or with ep = 1)
  double moe_imbalance = 1;
  TimeSplit split;
  // EP exchange seconds that overlapped F+B slots (dualpipev) hide behind
  // the other micro-batch's compute (runtime.ep_overlap): the makespan
  // without the overlap less the makespan with it; split.ep is net of it
  double ep_hidden_s = 0;
  double dp_reduction_s = 0;  // the whole gradient reduction; split.dp is its exposed part
  MemoryEstimate memory;      // of the rank that needs the most
  int memory_pp_rank = 0;
  std::vector<double> rank_total, rank_allocator;  // memory of each pipeline rank, bytes
  // Filled by add_policy_effects: each policy the plan uses, and the mesh
  // with none of them (step, bytes).
  std::vector<PolicyEffect> policy_effects;
  double baseline_step_s = 0, baseline_memory = 0;
  LinkClass cp_link = LinkClass::nvlink, ep_link = LinkClass::nvlink, pp_link = LinkClass::nvlink,
            dp_link = LinkClass::nvlink;
};

// Seconds of `w` on one rank alone at the profile's rates and efficiency.
double compute_seconds(const Work& w, const MachineProfile& m);
// Seconds of the step's update (gradient norm and AdamW) of `params` parameters.
double optimizer_seconds(const MachineProfile& m, double params);

// Per-action seconds before the pipeline is simulated; the search uses it to
// bound a mesh's step time from below.
struct ActionTimes {
  double t_f = 0, t_b = 0, t_w = 0, latency = 0;
  // The EP exchange inside t_f and t_b (the simulator's e_f, e_b: what an
  // overlapped F+B slot can hide)
  double e_f = 0, e_b = 0;
  double compute = 0, cp = 0, ep = 0;  // per micro-batch over the rank's chunks
  double after_pipeline = 0;           // dp reduction + agreements + optimizer + overhead
  double dp = 0;                       // the gradient reduction's exposed seconds
  double dp_total = 0;                 // all of it (= dp without grad buckets)
  double busiest_rank_s = 0;           // one micro-batch through the busiest rank's chunks
  double sharing = 1;        // ranks per core (>= 1), see MachineProfile::oversubscription
  double moe_imbalance = 1;  // busiest EP rank's routed rows over the mean
  int microbatches = 1, vpp = 1;
  std::vector<StageTimes> stages;  // per virtual stage, at a rank's own rate
  CoreSharing cores;               // which ranks share a node's cores
  double node_work_s = 0;  // the busiest node's compute of a step over its cores (shared only)
  // The pipeline's compute spread over the cores a node's ranks share.
  double cpu_bound_s() const { return node_work_s; }
  // Step time no schedule can beat: no bubble, and no idle core.
  double lower_bound_s() const;
  // Each virtual stage's f + b + w over the slowest stage's (the simulator's
  // stage_work).
  std::vector<double> stage_work() const;
};
ActionTimes action_times(const Config& cfg, const MeshPlan& plan, const ClusterShape& shape,
                         const MachineProfile& m);

// Full prediction (simulates the schedule twice: with and without the
// stage-to-stage latency, to split transfer time from bubble when detailed).
Prediction predict(const Config& cfg, const MeshPlan& plan, const ClusterShape& shape,
                   const MachineProfile& m, bool detailed = true);

// Prices the plan's recompute and sharding: p.policy_effects and the
// baseline (no recompute, no sharding) against the memory limit (0: none).
void add_policy_effects(const Config& cfg, const ClusterShape& shape, const MachineProfile& m,
                        double memory_limit_bytes, Prediction& p);

// Text report and one JSON object.
std::string prediction_text(const Prediction& p, double memory_limit_bytes);
std::string prediction_json(const Prediction& p);

}  // namespace trident::plan
