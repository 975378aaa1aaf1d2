// Trainer: one training step of this rank's part of the model.
//
// A step: cut the step's global batch into this rank's micro-batches, run
// them through the pipeline schedule (or straight through when pp = 1), sum
// gradients over their replicas (parallel/dp), agree on the loss, clip by
// the global gradient norm, update with AdamW and move the router bias.
// The loss is the mean over every target token of the global batch, so every
// mesh reports the one-rank loss. Serial use (unit tests) passes no
// communicators at all.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"
#include "trident/io/run_file.hpp"
#include "trident/model/data.hpp"
#include "trident/model/transformer.hpp"
#include "trident/train/optimizer.hpp"

namespace trident::train {

// The group communicators of this rank (null: that group is this rank alone)
// and its place in the mesh.
struct TrainComms {
  Communicator *world = nullptr, *pp = nullptr, *cp = nullptr, *ep = nullptr;
  Communicator *dpcp = nullptr, *expert_replica = nullptr;
  int pp_rank = 0, pp_size = 1, dp_rank = 0, dp_size = 1;
};

struct StepResult {
  StepMetrics metrics;                     // loss, aux, lr, grad_norm, times (rank-0 view)
  std::array<double, 4> comm_bytes{};      // cp, pp, ep, dp bytes sent by all ranks this step
  std::vector<std::vector<int64_t>> expert_tokens;  // [moe layer][expert], global batch
  std::vector<TimelineEvent> events;       // this rank's F/B/W/SEND/RECV of the step
  double compute_s = 0;                    // this rank's time in F, B, W
  std::vector<model::Capture> captures;    // this rank's activation captures
};

class Trainer {
 public:
  Trainer(const Config& cfg, TrainComms comms);
  ~Trainer();

  // Runs step `step` (0-based). capture: activations to keep (null: none).
  StepResult train_step(int64_t step, const model::CaptureRequest* capture = nullptr);

  model::ModelStage& stage() { return *stage_; }
  AdamW& optimizer() { return *opt_; }
  const Config& config() const { return cfg_; }
  const TrainComms& comms() const { return comms_; }
  int64_t tokens_per_step() const;  // tokens of the global batch

 private:
  void run_microbatches(int64_t step, std::vector<TimelineEvent>& events, double& compute_s);
  void init_pipeline();
  void run_pipeline(int64_t step, std::vector<TimelineEvent>& events, double& compute_s);

  Config cfg_;
  TrainComms comms_;
  std::unique_ptr<model::DataSource> data_;
  std::unique_ptr<model::ModelStage> stage_;
  std::unique_ptr<AdamW> opt_;
  std::vector<int64_t> positions_;
  // The lowered schedule and its executor (pp > 1; train/pipeline.cpp).
  struct Pipeline {
    virtual ~Pipeline() = default;
  };
  std::unique_ptr<Pipeline> pipe_;
};

}  // namespace trident::train
