// Search: every legal mesh of a cluster for one model, ranked by predicted
// step time, the best k kept.
//
// Candidates: pp (divisors of the world, at most n_layers), cp with its mode
// (ring and ulysses inside an NVLink domain; hybrid where neither serves cp,
// with the largest Ulysses group u that divides cp and the domain and splits
// the heads, the ring crossing domains), ep (dividing the experts and a stage), the schedules
// (interleaved with each vpp that leaves every chunk a layer; zb-v and
// dualpipev on the V placement), both CP
// layouts, and every split of the global batch into micro_batch_size x
// num_microbatches per data-parallel rank. A candidate is legal when the
// mapping rules (topo/mesh check_mesh) and every layer's config rules
// (train::check_config) accept it, and it fits when its predicted memory is
// within the limit. Ranking: predicted step time; ties (kStepTie) by the
// calibrated shape, then memory.
// Candidates are priced without the simulator first (a
// pipeline without bubble bounds the step from below); only those whose bound
// can still beat the k-th best are simulated, which keeps 1024 nodes x 8
// devices well inside a few seconds.
#pragma once
#include <string>
#include <vector>

#include "trident/plan/predict.hpp"

namespace trident::plan {

// Predicted steps closer than this share are a tie: the model does not
// resolve them, and the search ranks first the mesh whose tokens per
// micro-batch are nearest the profile's calibrated shape (least
// extrapolated), then the one with less memory.
inline constexpr double kStepTie = 1e-3;

struct SearchOptions {
  int top_k = 5;
  double memory_limit_bytes = 0;  // 0: no limit
  long long global_batch = 0;     // sequences per step; 0: the config's on its own mesh
};

struct SearchResult {
  std::vector<Prediction> best;  // fastest first
  long long candidates = 0, legal = 0, simulated = 0, refused_memory = 0;
  long long global_batch = 0;
  double seconds = 0;  // wall time of the search
};

// Why the plan is not a legal mesh on the shape (empty: it is). The rule is
// the one check_mesh or the config rules give.
std::string plan_refusal(const Config& cfg, const ClusterShape& shape, const MeshPlan& plan);

// Throws InputError (one line) when no candidate is legal and fits.
SearchResult search(const Config& cfg, const ClusterShape& shape, const MachineProfile& m,
                    const SearchOptions& opt);

std::string search_text(const SearchResult& r, double memory_limit_bytes);
std::string search_json(const SearchResult& r);

}  // namespace trident::plan
