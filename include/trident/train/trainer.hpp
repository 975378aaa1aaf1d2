// Trainer: one training step of this rank's part of the model.
//
// A step: cut the step's global batch into this rank's micro-batches, run
// them through the pipeline schedule (pp = 1 too: one stage), sum
// gradients over their replicas (parallel/dp), agree on the loss, clip by
// the global gradient norm, update with AdamW and move the router bias.
// With train.optimizer_sharding = "dp" the sum is reduce-scattered instead,
// each rank updates its shard and the shards are all-gathered (ZeRO-1,
// parallel/dp/zero.hpp).
// The update is applied only when the loss, the aux losses and the gradient
// norm are finite (the same values on every rank, so every rank decides
// alike); otherwise parameters, optimizer state (AdamW's t included) and
// router biases stay as they were, and the result says where the first
// non-finite gradient appeared. Every runtime.verify_every-th step runs its
// forward and backward twice and compares this rank's gradients and loss
// sums bit for bit (a deterministic program differs only on faulty hardware).
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
#include "trident/core/param_store.hpp"
#include "trident/core/profiler.hpp"
#include "trident/io/run_file.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/model/data.hpp"
#include "trident/model/transformer.hpp"
#include "trident/parallel/dp/grad_sync.hpp"
#include "trident/train/optimizer.hpp"
#include "trident/train/rank_stats.hpp"

namespace trident::train {

// The group communicators of this rank (null: that group is this rank alone)
// and its place in the mesh.
struct TrainComms {
  Communicator *world = nullptr, *pp = nullptr, *cp = nullptr, *ep = nullptr;
  Communicator *dpcp = nullptr, *expert_replica = nullptr;
  int pp_rank = 0, pp_size = 1, dp_rank = 0, dp_size = 1;
  int local_rank = 0;  // on its node (the device is the one made current, training_device)
};

// The device a training run uses: runtime.backend resolved on this rank's
// current device, the one its topology chose and build_communicators made
// current before any communicator (auto: that GPU where the build has CUDA
// and the rank sees one, else the host). Everything the step touches lives
// there; the host reads scalars and the copies a user asked for (captures,
// checkpoints, verify_every). The emulated device proves that in CI (no
// host access to device memory, no host pointer handed to a device op).
Device training_device(Backend backend);

struct StepResult {
  StepMetrics metrics;                 // loss, aux, lr, grad_norm, times (rank-0 view)
  std::array<double, 4> comm_bytes{};  // cp, pp, ep, dp bytes sent by all ranks this step
  std::vector<std::vector<int64_t>> expert_tokens;  // [moe layer][expert], global batch
  std::vector<TimelineEvent> events;                // this rank's F/B/W/SEND/RECV of the step
  double compute_s = 0;                             // this rank's time in F, B, W
  StepTimes times;                                  // phases and waits (/ranks/steps)
  std::vector<model::Capture> captures;             // this rank's activation captures
  // The guard, the same on every rank: loss, aux losses and gradient norm
  // finite; the optimizer update applied (only when finite and, on a
  // verified step, both runs agreed).
  bool finite = true, applied = true;
  // Not finite: the world rank whose own gradient (before the reduction)
  // first held a NaN or infinity (model order, then rank; -1: none did, only
  // the loss), and on that rank alone the parameter ("layers.2.attn.wq (layer 2)").
  int nonfinite_rank = -1;
  std::string nonfinite_param;
  // runtime.verify_every: the step ran twice; the world ranks whose second
  // run differed (the same list on every rank); the re-run's time (max over ranks).
  bool verified = false;
  std::vector<int> verify_mismatch;
  double verify_s = 0;
};

// Test hooks, set from TRIDENT_TEST_* by train::run on one rank only: at
// step nan_at this rank's first gradient element becomes NaN after the
// backward; at step flip_at (a verified step) its lowest bit flips in the
// re-run, as a memory fault would.
struct GradientFault {
  int64_t nan_at = -1, flip_at = -1;
};

class Trainer {
 public:
  // The lowered schedule and its executor (defined in train/pipeline.cpp).
  struct Pipeline {
    virtual ~Pipeline() = default;
  };
  // Selects the device from runtime.backend (InputError when it cannot be
  // met) and builds the stage and the optimizer on it.
  Trainer(const Config& cfg, TrainComms comms);
  ~Trainer();

  // Runs step `step` (0-based). capture: activations to keep (null: none).
  StepResult train_step(int64_t step, const model::CaptureRequest* capture = nullptr);
  // The step's forward (and backward, which the pipeline schedules pair
  // with it) without any update: parameters, optimizer and router biases
  // stay as they are. metrics.loss / aux_loss / z_loss are the global
  // batch's; captures are this rank's (trident eval).
  StepResult evaluate(int64_t step, const model::CaptureRequest* capture);
  void set_gradient_fault(GradientFault f) { fault_ = f; }
  // Validation loss: the mean cross-entropy over every target of batches
  // [0, batches) of `data` (global batches of this mesh's size), the same on
  // every rank and every mesh. The batches run through the pipeline
  // schedule like a step; parameters, optimizer and router biases stay as
  // they are (the gradients are left for the next step to zero).
  struct EvalResult {
    double loss = 0;
    int64_t targets = 0;
  };
  EvalResult evaluate(const model::DataSource& data, int batches);

  model::ModelStage& stage() { return *stage_; }
  const model::DataSource& data() const { return *data_; }
  const ParamStore& param_store() const { return *store_; }
  // Which part of the store this rank's optimizer updates (all of it unless
  // train.optimizer_sharding = "dp").
  const dp::Sharding& sharding() const { return grads_->sharding(); }
  AdamW& optimizer() { return *opt_; }
  const Config& config() const { return cfg_; }
  const TrainComms& comms() const { return comms_; }
  // The communication counters of this rank's communicators (the world's
  // set; without a world, none count).
  CommCounters& counters() { return comms_.world ? comms_.world->counters() : no_comm_; }
  // Where this rank's kernels run ("cpu" | "cuda:N" recorded in the run file).
  Device device() const { return device_->device(); }
  const kernels::Ctx& ctx() const { return device_->ctx(); }
  // The allocator of that device (its peak is the rank's measured memory).
  const Allocator& allocator() const { return device_->allocator(); }
  int64_t tokens_per_step() const;   // tokens of the global batch
  int64_t samples_per_step() const;  // sequences of the global batch
  // Global positions of this rank's tokens of a sequence (its cp share).
  const std::vector<int64_t>& positions() const { return positions_; }

 private:
  void init_pipeline();
  void run_forwards(const model::DataSource& data, int64_t batch,
                    const model::CaptureRequest* capture, std::vector<TimelineEvent>& events,
                    double& compute_s);
  // forward_only: the schedule's forwards alone (evaluation).
  void run_pipeline(int64_t step, std::vector<TimelineEvent>& events, double& compute_s,
                    bool forward_only = false);
  // Forward and backward of the step into the gradients (zeroed first).
  // bucketed: the gradient buckets' reductions start during the backward
  // (finished by train_step); otherwise the gradients stay this rank's own.
  void compute_gradients(int64_t step, const model::CaptureRequest* capture, StepResult& res,
                         bool bucketed = false);
  // A bucket's parameters before their reduction is posted: the test hook's
  // NaN goes in here, and the first non-finite gradient is noted.
  void before_bucket_reduce(const std::vector<Param*>& params);
  // runtime.verify_every: runs the step again and compares (StepResult::verify_*).
  void verify_step(int64_t step, StepResult& res);
  // Agrees on StepResult::finite and on the first non-finite gradient
  // (local_first: this rank's, before the reduction; sums_finite: its view of
  // the reduced loss sums and norm).
  void agree_on_finite(int local_first, bool sums_finite, StepResult& res);
  // This rank's first parameter (index in params()) with a non-finite
  // gradient before the reduction; -1: none.
  int local_nonfinite_gradient(bool bucketed) const;
  // The same among the parameters the gradient norm leaves out
  // (GradReduce::none): with one rank the norm is the scan of the others.
  int unnormed_nonfinite_gradient() const;
  void fill_timing(StepResult& res, const CommCounters& before, double t_begin);
  bool verifies(int64_t step) const;
  bool norm_is_scan(bool bucketed) const;
  std::array<double, 3> reduce_sums(StepResult& res);
  void apply_update(StepResult& res, double norm, double lr);

  Config cfg_;
  TrainComms comms_;
  CommCounters no_comm_;  // counters() without a world: stays zero
  std::unique_ptr<kernels::DeviceContext> device_;
  std::unique_ptr<model::DataSource> data_;
  std::unique_ptr<model::ModelStage> stage_;
  std::unique_ptr<ParamStore> store_;  // the stage's parameters, one allocation
  // The gradients' reduction over the replicas: plain, sharded
  // (train.optimizer_sharding = "dp") and/or bucketed (train.grad_bucket_mb).
  std::unique_ptr<dp::GradSync> grads_;
  std::unique_ptr<AdamW> opt_;
  int64_t bucket_step_ = -1;             // the step whose buckets are in flight
  const Param* bucket_first_ = nullptr;  // its first non-finite gradient (model order)
  std::vector<int64_t> positions_;
  model::DocumentBalance by_docs_;  // parallel.cp_layout = "docs": each sample's own layout
  std::unique_ptr<Pipeline> pipe_;
  GradientFault fault_;
  StepTimes times_;  // the step's phases so far (the pipeline adds F, B, W)
};

// The profiler spans of one step as this rank's timeline events
// (/timeline/events); counters are not part of the timeline.
class TimelineSink : public prof::Sink {
 public:
  TimelineSink(std::vector<TimelineEvent>& events, int rank, int64_t step)
      : events_(events), rank_(rank), step_(step) {}
  void span(const prof::Span& s) override {
    events_.push_back(TimelineEvent{rank_, step_, s.kind, s.stage, s.chunk, s.microbatch,
                                    s.t_begin_s, s.t_end_s});
  }
  void add(const char*, double) override {}
  void peak(const char*, double) override {}

 private:
  std::vector<TimelineEvent>& events_;
  int rank_;
  int64_t step_;
};

// Writes this step's activation captures (every rank's) into the run file in
// global order: captures travel to rank 0, which assembles whole sequences;
// every rank then makes the same collective write_activation calls, for
// output.activation_layers x output.activations (router_logits on MoE
// layers only). Collective over world.
void write_activations(RunFile& file, const Config& cfg, Communicator* world, int64_t step,
                       const std::vector<int64_t>& positions,
                       const std::vector<model::Capture>& mine);

// Checks output.activation_* against the model and the global batch
// (InputError naming the key).
void validate_activation_request(const Config& cfg, int64_t global_batch);

}  // namespace trident::train
