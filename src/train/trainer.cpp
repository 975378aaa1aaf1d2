// One training step (see train/trainer.hpp).
#include "trident/train/trainer.hpp"

#include <cmath>

#include "trident/core/error.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/model/blocks.hpp"
#include "trident/parallel/dp/grad_reduce.hpp"
#include "trident/parallel/pp/generators.hpp"

namespace trident::train {

namespace {

// The device a training run uses. The kernels and communicators have CUDA
// implementations, but the model's activations, parameters and optimizer
// state are host Tensors, so handing the model a CUDA Ctx would pass host
// pointers to device kernels. Until Tensor carries a device, "auto" trains on
// the host and "cuda" is refused with the reason; select_device still runs
// first, so a build without CUDA or a rank without a GPU says that instead.
Device training_device(Backend backend, int local_rank) {
  const Device d = kernels::select_device(backend, local_rank);
  if (d.is_cpu() || backend == Backend::automatic) return Device::cpu();
  throw InputError(
      "runtime.backend: 'cuda' asked for, but trident run keeps the model's tensors on the "
      "host in this version (the CUDA kernels are checked by scripts/gpu-check.sh); set "
      "runtime.backend = \"cpu\" or \"auto\"");
}

}  // namespace

Trainer::Trainer(const Config& cfg, TrainComms comms) : cfg_(cfg), comms_(comms) {
  device_ = std::make_unique<kernels::DeviceContext>(
      training_device(cfg_.runtime.backend, comms_.local_rank));
  data_ = model::make_data_source(cfg_, comms_.dp_size);
  model::StageComms sc{comms_.cp, comms_.ep};
  positions_ = model::local_positions(cfg_, sc);
  const pp::Placement placement = pp::schedule_placement(config_name(cfg_.parallel.schedule),
                                                         comms_.pp_size, cfg_.parallel.vpp);
  stage_ = std::make_unique<model::ModelStage>(cfg_, comms_.pp_rank, comms_.pp_size, sc,
                                               placement.stages.at(size_t(comms_.pp_rank)),
                                               device_->ctx());
  opt_ = std::make_unique<AdamW>(stage_->params(), cfg_.train, device_->ctx());
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

StepResult Trainer::train_step(int64_t step, const model::CaptureRequest* capture) {
  StepResult res;
  const CommCounters before = comm_counters();
  const double t_begin = now_s();
  const auto& d = cfg_.data;
  const int64_t n_seq = int64_t(d.micro_batch_size) * d.num_microbatches * comms_.dp_size;
  const double n_targets = double(n_seq) * double(data_->targets_per_sample());
  for (Param* p : stage_->params())
    kernels::fill(device_->ctx(), p->grad.ptr(), p->grad.numel(), 0.0f);
  stage_->begin_step(model::make_microbatches(*data_, d, step, comms_.dp_rank, positions_),
                     float(1.0 / n_targets), float(1.0 / double(n_seq)), capture);
  run_pipeline(step, res.events, res.compute_s);
  {
    // ATTN_F/ATTN_B: begin of the call, length = kernel time on this rank.
    TimelineSink timeline(res.events, comms_.world ? comms_.world->rank() : 0, step);
    for (const model::AttnSpan& a : stage_->take_attention_spans())
      if (cfg_.output.timeline)
        timeline.span(prof::Span{a.backward ? "ATTN_B" : "ATTN_F", comms_.pp_rank, a.layer, -1,
                                 a.t_begin_s, a.t_begin_s + a.compute_s});
  }

  dp::reduce_gradients(stage_->params(), comms_.dpcp, comms_.expert_replica, device_->ctx());

  double sums[3] = {stage_->loss_sum(), stage_->aux_sum(), stage_->z_sum()};
  if (comms_.world && comms_.world->size() > 1) comms_.world->allreduce_sum(sums, 3);
  res.expert_tokens = stage_->expert_tokens();
  if (comms_.world && comms_.world->size() > 1)
    for (auto& row : res.expert_tokens) comms_.world->allreduce_sum(row.data(), row.size());
  stage_->update_router_bias(res.expert_tokens);

  const double norm = std::sqrt(dp::global_grad_sumsq(
      stage_->params(), comms_.dpcp, comms_.expert_replica, comms_.world, device_->ctx()));
  const double clip = cfg_.train.grad_clip;
  const float scale = clip > 0 && norm > clip ? float(clip / (norm + 1e-6)) : 1.0f;
  const double lr = learning_rate(cfg_.train, step);
  opt_->step(lr, scale);

  const double t_end = now_s();
  StepMetrics& m = res.metrics;
  m.step = step;
  m.loss = sums[0] / n_targets;
  m.aux_loss = sums[1] / double(n_seq);
  m.z_loss = sums[2] / double(n_seq);
  m.lr = lr;
  m.grad_norm = norm;
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
  const CommCounters diff = comm_counters() - before;
  for (int k = 0; k < kNumCommKinds; ++k) res.comm_bytes[size_t(k)] = diff.bytes_sent[size_t(k)];
  if (comms_.world && comms_.world->size() > 1)
    comms_.world->allreduce_sum(res.comm_bytes.data(), res.comm_bytes.size());
  res.captures = stage_->take_captures();
  return res;
}

}  // namespace trident::train
