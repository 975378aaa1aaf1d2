// One training step (see train/trainer.hpp).
#include "trident/train/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "trident/core/error.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/model/blocks.hpp"
#include "trident/parallel/dp/grad_reduce.hpp"
#include "trident/parallel/dp/zero.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/train/step_guard.hpp"

namespace trident::train {

namespace {

// The parameter (of those `keep` selects) whose gradient is the first
// non-finite one in model order; null: none.
template <class Keep>
const Param* first_nonfinite_where(const kernels::Ctx& ctx, const std::vector<Param*>& params,
                                   int n_layers, Keep keep) {
  std::vector<Param*> kept;
  for (Param* p : params)
    if (keep(p)) kept.push_back(p);
  const int i = first_nonfinite_gradient(ctx, kept, n_layers);
  return i < 0 ? nullptr : kept[size_t(i)];
}

// p's index in params; -1 for null.
int index_in(const std::vector<Param*>& params, const Param* p) {
  return p ? int(std::find(params.begin(), params.end(), p) - params.begin()) : -1;
}

}  // namespace

Device training_device(Backend backend) {
  return kernels::select_device(backend, kernels::current_device_index());
}

Trainer::Trainer(const Config& cfg, TrainComms comms) : cfg_(cfg), comms_(comms) {
  device_ = std::make_unique<kernels::DeviceContext>(training_device(cfg_.runtime.backend),
                                                     cfg_.train.tf32);
  data_ = model::make_data_source(cfg_, comms_.dp_size);
  model::StageComms sc{comms_.cp, comms_.ep};
  positions_ = model::local_positions(cfg_, sc);
  by_docs_ = model::document_balance(cfg_, sc);
  const pp::Placement placement =
      pp::schedule_placement(cfg_.parallel.schedule, comms_.pp_size, cfg_.parallel.vpp);
  {
    // The parameters as built (moved into the store below) and bf16 copies.
    MemKindScope kind(MemKind::parameters);
    stage_ = std::make_unique<model::ModelStage>(cfg_, comms_.pp_rank, comms_.pp_size, sc,
                                                 placement.stages.at(size_t(comms_.pp_rank)),
                                                 device_->ctx());
  }
  const kernels::Ctx& ctx = device_->ctx();
  const bool sharded = cfg_.train.optimizer_sharding == OptimizerSharding::dp;
  store_ = std::make_unique<ParamStore>(
      stage_->params(), device_->allocator(),
      [&ctx](Tensor& dst, const Tensor& src) { kernels::copy(ctx, dst, src); },
      [&ctx](Tensor& dst, float value) { kernels::fill(ctx, dst, value); },
      dp::GradSync::store_multiples(sharded, comms_.dpcp, comms_.expert_replica));
  grads_ = std::make_unique<dp::GradSync>(*store_, sharded, comms_.dpcp, comms_.expert_replica);
  const dp::Sharding& sharding = grads_->sharding();
  opt_ = std::make_unique<AdamW>(*store_, sharding.owned, sharding.base, sharding.owned_numel,
                                 cfg_.train, ctx, sharding.part);
  if (cfg_.train.grad_bucket_mb > 0)
    grads_->use_buckets(cfg_.train.grad_bucket_mb, cfg_.data.num_microbatches,
                        [this](const std::vector<Param*>& ps) { before_bucket_reduce(ps); });
  init_pipeline();
}

Trainer::~Trainer() = default;

int64_t Trainer::tokens_per_step() const {
  return int64_t(cfg_.data.micro_batch_size) * cfg_.data.num_microbatches * comms_.dp_size *
         cfg_.data.seq_len;
}

int64_t Trainer::samples_per_step() const {
  return int64_t(cfg_.data.micro_batch_size) * cfg_.data.num_microbatches * comms_.dp_size;
}

void Trainer::before_bucket_reduce(const std::vector<Param*>& params) {
  const auto all = stage_->params();
  if (bucket_step_ == fault_.nan_at && !all.empty() &&
      std::find(params.begin(), params.end(), all.front()) != params.end())
    kernels::fill(device_->ctx(), all.front()->grad.view(0, {1}),
                  std::numeric_limits<float>::quiet_NaN());
  const int n_layers = cfg_.model.n_layers;
  const int i = first_nonfinite_gradient(device_->ctx(), params, n_layers);
  if (i < 0) return;
  const Param* p = params[size_t(i)];
  if (!bucket_first_ ||
      model_order_of(p->name, n_layers) < model_order_of(bucket_first_->name, n_layers))
    bucket_first_ = p;
}

void Trainer::compute_gradients(int64_t step, const model::CaptureRequest* capture, StepResult& res,
                                bool bucketed) {
  const auto& d = cfg_.data;
  const int64_t n_seq = samples_per_step();
  const double n_targets = double(std::max<int64_t>(1, data_->targets_in_batch(step, n_seq)));
  Tensor grads = store_->grads();
  kernels::fill(device_->ctx(), grads, 0.0f);
  times_ = StepTimes{};  // this run's phases (a verified step's re-run has its own)
  {
    PhaseClock clock(times_.phase[int(Phase::data)], counters());
    stage_->begin_step(
        model::make_microbatches(*data_, d, step, comms_.dp_rank, positions_, by_docs_),
        float(1.0 / n_targets), float(1.0 / double(n_seq)), capture);
  }
  if (bucketed) {
    bucket_step_ = step;
    bucket_first_ = nullptr;
    grads_->buckets()->begin_step();
    stage_->set_grads_ready(
        [this](const std::vector<Param*>& ps) { grads_->buckets()->ready(ps); });
  }
  run_pipeline(step, res.events, res.compute_s);
  res.times = times_;
  stage_->set_grads_ready(nullptr);
  // ATTN_F/ATTN_B: begin of the call, length = kernel time on this rank.
  TimelineSink timeline(res.events, comms_.world ? comms_.world->rank() : 0, step);
  for (const model::AttnSpan& a : stage_->take_attention_spans())
    if (cfg_.output.timeline)
      timeline.span(prof::Span{a.backward ? "ATTN_B" : "ATTN_F", comms_.pp_rank, a.layer, -1,
                               a.t_begin_s, a.t_begin_s + a.compute_s});
  if (step == fault_.nan_at && !stage_->params().empty() &&
      !(bucketed && grads_->buckets()->holds(stage_->params().front())))
    kernels::fill(device_->ctx(), stage_->params().front()->grad.view(0, {1}),
                  std::numeric_limits<float>::quiet_NaN());
}

// The forwards alone of `data`'s batch `batch`: the loss and the captures
// come from them, and nothing is kept for a backward (the scales of a
// training step, so the same bits).
void Trainer::run_forwards(const model::DataSource& data, int64_t batch,
                           const model::CaptureRequest* capture, std::vector<TimelineEvent>& events,
                           double& compute_s) {
  const int64_t n_seq = samples_per_step();
  const double targets = double(std::max<int64_t>(1, data.targets_in_batch(batch, n_seq)));
  stage_->begin_step(
      model::make_microbatches(data, cfg_.data, batch, comms_.dp_rank, positions_, by_docs_),
      float(1.0 / targets), float(1.0 / double(n_seq)), capture);
  run_pipeline(batch, events, compute_s, /*forward_only=*/true);
  stage_->take_attention_spans();  // not a training step's: kept out of the timeline
}

Trainer::EvalResult Trainer::evaluate(const model::DataSource& data, int batches) {
  const int64_t n_seq = samples_per_step();
  double sum = 0;
  EvalResult res;
  for (int b = 0; b < batches; ++b) {
    const int64_t targets = data.targets_in_batch(b, n_seq);
    std::vector<TimelineEvent> events;
    double compute_s = 0;
    run_forwards(data, b, nullptr, events, compute_s);
    double s = stage_->loss_sum();
    if (comms_.world && comms_.world->size() > 1) comms_.world->allreduce_sum(&s, 1);
    sum += s;
    res.targets += targets;
  }
  res.loss = res.targets > 0 ? sum / double(res.targets) : 0.0;
  return res;
}

void Trainer::verify_step(int64_t step, StepResult& res) {
  const double t0 = now_s();
  auto sums = [&] {
    return std::vector<double>{stage_->loss_sum(), stage_->aux_sum(), stage_->z_sum()};
  };
  StepSnapshot first;
  first.take(device_->ctx(), stage_->params(), sums());
  StepResult again;  // its events and compute time are not this step's
  compute_gradients(step, nullptr, again);
  if (step == fault_.flip_at && !stage_->params().empty()) {
    // one bit of one gradient element, through explicit copies (the
    // gradient may be device memory)
    const kernels::Ctx& ctx = device_->ctx();
    Tensor g = stage_->params().front()->grad.view(0, {1});
    Tensor host = kernels::to_host(ctx, g);
    uint32_t bits;
    std::memcpy(&bits, host.data_ptr(), sizeof bits);
    bits ^= 1u;
    std::memcpy(host.data_ptr(), &bits, sizeof bits);
    Tensor flipped = kernels::from_host(ctx, host.data_ptr(), {1}, DType::f32);
    kernels::copy(ctx, g, flipped);
  }
  const int differs = first.same_bits(device_->ctx(), stage_->params(), sums()) ? 0 : 1;
  const int world = comms_.world ? comms_.world->size() : 1;
  std::vector<int> all(size_t(world), differs);
  if (world > 1) comms_.world->allgather(&differs, all.data(), sizeof(int));
  res.verified = true;
  for (int r = 0; r < world; ++r)
    if (all[size_t(r)]) res.verify_mismatch.push_back(r);
  res.verify_s = now_s() - t0;
  if (world > 1) comms_.world->allreduce_max(&res.verify_s, 1);
}

void Trainer::agree_on_finite(int local_first, bool sums_finite, StepResult& res) {
  const int world = comms_.world ? comms_.world->size() : 1;
  const int rank = comms_.world ? comms_.world->rank() : 0;
  const int n_layers = cfg_.model.n_layers;
  const auto params = stage_->params();
  // Rounding can differ between ranks near an overflow: one reduction makes
  // the verdict (and where it came from) the same everywhere.
  int64_t agree[2] = {sums_finite ? 1 : 0, kNoKey};
  if (local_first >= 0)
    agree[1] =
        nonfinite_key(model_order_of(params[size_t(local_first)]->name, n_layers), rank, world);
  if (world > 1) comms_.world->allreduce_min(agree, 2);
  res.finite = agree[0] == 1 && agree[1] == kNoKey;
  if (agree[1] == kNoKey) return;
  res.nonfinite_rank = rank_of_key(agree[1], world);
  if (res.nonfinite_rank == rank)
    res.nonfinite_param = describe_param(params[size_t(local_first)]->name, n_layers);
}

// The first non-finite gradient among the parameters that the gradient norm
// leaves out (GradReduce::none), as an index into the stage's parameters.
int Trainer::unnormed_nonfinite_gradient() const {
  const auto params = stage_->params();
  return index_in(
      params, first_nonfinite_where(device_->ctx(), params, cfg_.model.n_layers,
                                    [](const Param* p) { return p->reduce == GradReduce::none; }));
}

// Where a non-finite value came from is visible only before the reduction
// (with buckets: noted as each bucket's reduction was posted).
int Trainer::local_nonfinite_gradient(bool bucketed) const {
  if (!bucketed)
    return first_nonfinite_gradient(device_->ctx(), stage_->params(), cfg_.model.n_layers);
  // The buckets' parameters were checked before their reductions; the
  // others (not reduced) are checked now.
  const auto params = stage_->params();
  const int n_layers = cfg_.model.n_layers;
  const Param* rest = first_nonfinite_where(device_->ctx(), params, n_layers, [&](const Param* p) {
    return !grads_->buckets()->holds(p);
  });
  const Param* first = bucket_first_;
  if (rest &&
      (!first || model_order_of(rest->name, n_layers) < model_order_of(first->name, n_layers)))
    first = rest;
  return index_in(params, first);
}

// Whether step's gradients are computed twice and compared (runtime.verify_every).
bool Trainer::verifies(int64_t step) const {
  const int every = cfg_.runtime.verify_every;
  return every > 0 && (step + 1) % every == 0;
}

// On one rank nothing is reduced: the norm reads the gradients the backward
// left, and its pass is the scan (a float squared in double cannot
// overflow, so the sum is finite exactly when every element is). The
// parameters are then scanned only to name the first non-finite one, and
// those outside the norm (GradReduce::none) before it.
bool Trainer::norm_is_scan(bool bucketed) const {
  const bool one_rank = !comms_.world || comms_.world->size() == 1;
  return one_rank && !bucketed && !grads_->sharded();
}

// The step's loss sums (loss, aux, z) and expert token counts, summed over
// the world.
std::array<double, 3> Trainer::reduce_sums(StepResult& res) {
  std::array<double, 3> sums = {stage_->loss_sum(), stage_->aux_sum(), stage_->z_sum()};
  res.expert_tokens = stage_->expert_tokens();
  if (!comms_.world || comms_.world->size() == 1) return sums;
  comms_.world->allreduce_sum(sums.data(), 3);
  for (auto& row : res.expert_tokens) comms_.world->allreduce_sum(row.data(), row.size());
  return sums;
}

// Applies the update when every rank agreed the step is good: router
// biases, then AdamW with the clipped norm, then (sharded) the gather.
void Trainer::apply_update(StepResult& res, double norm, double lr) {
  res.applied = res.finite && res.verify_mismatch.empty();
  if (!res.applied) return;
  stage_->update_router_bias(res.expert_tokens);
  const double clip = cfg_.train.grad_clip;
  const float scale = clip > 0 && norm > clip ? float(clip / (norm + 1e-6)) : 1.0f;
  opt_->step(lr, scale);
  grads_->after_update(device_->ctx());
}

StepResult Trainer::train_step(int64_t step, const model::CaptureRequest* capture) {
  StepResult res;
  const CommCounters before = counters();
  const double t_begin = now_s();
  const int64_t n_seq = samples_per_step();
  const double n_targets = double(std::max<int64_t>(1, data_->targets_in_batch(step, n_seq)));
  const bool verifying = verifies(step);
  // A verified step compares this rank's own gradients of two runs, so it
  // reduces after the pipeline as without buckets.
  const bool bucketed = grads_->buckets() && !verifying;
  compute_gradients(step, capture, res, bucketed);
  res.captures = stage_->take_captures();
  if (verifying) verify_step(step, res);
  PhaseClock optimizer(res.times.phase[int(Phase::optimizer)], counters());  // guard to update
  // The work after the pipeline, as spans of the timeline (host clock).
  TimelineSink timeline(res.events, comms_.world ? comms_.world->rank() : 0, step);
  double t_mark = now_s();
  auto phase = [&](const char* kind) {
    const double t = now_s();
    if (cfg_.output.timeline) timeline.span(prof::Span{kind, comms_.pp_rank, -1, -1, t_mark, t});
    t_mark = t;
  };
  const bool scan_in_norm = norm_is_scan(bucketed);
  int local_first =
      scan_in_norm ? unnormed_nonfinite_gradient() : local_nonfinite_gradient(bucketed);
  phase("GUARD");
  grads_->reduce(bucketed, device_->ctx());
  phase("GRAD_REDUCE");
  const std::array<double, 3> sums = reduce_sums(res);
  const double norm = std::sqrt(grads_->sumsq(comms_.world, device_->ctx()));
  const double lr = learning_rate(cfg_.train, step);
  if (scan_in_norm && local_first < 0 && !std::isfinite(norm))
    local_first = local_nonfinite_gradient(false);
  const bool sums_finite = std::isfinite(sums[0]) && std::isfinite(sums[1]) &&
                           std::isfinite(sums[2]) && std::isfinite(norm);
  agree_on_finite(local_first, sums_finite, res);
  phase("NORM");
  apply_update(res, norm, lr);
  phase("UPDATE");
  res.metrics = StepMetrics{.step = step,
                            .loss = sums[0] / n_targets,
                            .aux_loss = sums[1] / double(n_seq),
                            .z_loss = sums[2] / double(n_seq),
                            .lr = lr,
                            .grad_norm = norm};
  optimizer.stop();
  fill_timing(res, before, t_begin);
  return res;
}

StepResult Trainer::evaluate(int64_t step, const model::CaptureRequest* capture) {
  StepResult res;
  const CommCounters before = counters();
  const double t_begin = now_s();
  const int64_t n_seq = samples_per_step();
  const double n_targets = double(n_seq) * double(data_->targets_per_sample());
  run_forwards(*data_, step, capture, res.events, res.compute_s);
  res.captures = stage_->take_captures();
  double sums[3] = {stage_->loss_sum(), stage_->aux_sum(), stage_->z_sum()};
  if (comms_.world && comms_.world->size() > 1) comms_.world->allreduce_sum(sums, 3);
  res.applied = false;
  StepMetrics& m = res.metrics;
  m.step = step;
  m.loss = sums[0] / n_targets;
  m.aux_loss = sums[1] / double(n_seq);
  m.z_loss = sums[2] / double(n_seq);
  fill_timing(res, before, t_begin);
  return res;
}

void Trainer::fill_timing(StepResult& res, const CommCounters& before, double t_begin) {
  const double t_end = now_s();
  StepMetrics& m = res.metrics;
  // the step's makespan over all ranks, and each rank's idle share of it
  double span[2] = {-t_begin, t_end};
  double bubble = 0;
  if (comms_.world && comms_.world->size() > 1) comms_.world->allreduce_max(span, 2);
  const double makespan = span[0] + span[1];
  bubble = makespan > 0 ? std::max(0.0, 1.0 - res.compute_s / makespan) : 0.0;
  if (comms_.world && comms_.world->size() > 1) {
    comms_.world->allreduce_sum(&bubble, 1);
    bubble /= comms_.world->size();
  }
  m.step_time_s = makespan;
  m.tokens_per_s = makespan > 0 ? double(tokens_per_step()) / makespan : 0.0;
  m.bubble_fraction = bubble;
  const CommCounters diff = counters() - before;
  for (int k = 0; k < kNumCommKinds; ++k) res.comm_bytes[size_t(k)] = diff.bytes_sent[size_t(k)];
  for (int k = 0; k < kNumCommKinds; ++k) res.times.wait[size_t(k)] = diff.wait_s[size_t(k)];
  res.times.step_s = t_end - t_begin;
  if (comms_.world && comms_.world->size() > 1)
    comms_.world->allreduce_sum(res.comm_bytes.data(), res.comm_bytes.size());
}

}  // namespace trident::train
