// The step's micro-batches run under the configured schedule through the
// pipeline executor, with the model stage as the executor's unit of work
// (pp = 1 as well: one stage, nothing sent).
#include "trident/core/error.hpp"
#include "trident/parallel/pp/executor.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {
namespace {

// The executor's view of this rank's chunks.
class StageAdapter : public pp::PipelineStage {
 public:
  StageAdapter(model::ModelStage& s, StepTimes& times, const CommCounters& counters)
      : s_(s), times_(times), counters_(counters) {}
  int64_t boundary_numel(int chunk, int mb) override { return s_.boundary_numel(chunk, mb); }
  Allocator& allocator() override { return s_.allocator(); }
  void forward(int chunk, int mb, const Tensor& in, Tensor& out) override {
    PhaseClock clock(times_.phase[int(Phase::forward)], counters_);
    s_.forward(chunk, mb, in, out);
  }
  void backward(int chunk, int mb, const Tensor& g_out, Tensor& g_in, bool weight_grad) override {
    PhaseClock clock(times_.phase[int(Phase::backward)], counters_);
    s_.backward(chunk, mb, g_out, g_in, weight_grad);
  }
  void backward_weight(int chunk, int mb) override {
    PhaseClock clock(times_.phase[int(Phase::weight)], counters_);
    s_.backward_weight(chunk, mb);
  }
  void discard_forward(int chunk, int mb) override { s_.discard_forward(chunk, mb); }

 private:
  model::ModelStage& s_;
  StepTimes& times_;
  const CommCounters& counters_;
};

struct ExecutorPipeline : Trainer::Pipeline {
  pp::Schedule lowered;
  pp::Schedule forward_only;  // evaluation: the same order without the backward
  std::unique_ptr<StageAdapter> adapter;
};

}  // namespace

void Trainer::init_pipeline() {
  const auto& p = cfg_.parallel;
  auto pipe = std::make_unique<ExecutorPipeline>();
  const pp::Schedule compute =
      pp::make_schedule(p.schedule, comms_.pp_size, cfg_.data.num_microbatches, p.vpp);
  pipe->lowered = pp::lower(compute);
  pp::validate(pipe->lowered);
  pipe->forward_only = pp::lower(pp::forward_only_of(compute));
  pp::validate(pipe->forward_only);
  pipe->adapter = std::make_unique<StageAdapter>(*stage_, times_, counters());
  pipe_ = std::move(pipe);
}

void Trainer::run_pipeline(int64_t step, std::vector<TimelineEvent>& events, double& compute_s,
                           bool forward_only) {
  auto& pipe = static_cast<ExecutorPipeline&>(*pipe_);
  TRIDENT_CHECK(comms_.pp || comms_.pp_size == 1, "pipeline parallelism without a pp communicator");
  pp::ExecOptions options;
  options.overlap_pairs = cfg_.runtime.ep_overlap;
  TimelineSink timeline(events, comms_.world ? comms_.world->rank() : 0, step);
  if (cfg_.output.timeline) options.profiler = &timeline;
  pp::ExecResult r = pp::execute(forward_only ? pipe.forward_only : pipe.lowered, comms_.pp_rank,
                                 *pipe.adapter, comms_.pp, int(step), nullptr, options);
  compute_s += r.busy_s;
  // the longest receive: whom this rank waited on in the pipeline
  for (const pp::ActionTiming& t : r.actions) {
    const bool fwd = t.action.op == pp::Op::RECV_F;
    if ((!fwd && t.action.op != pp::Op::RECV_B) || t.t_end_s - t.t_begin_s <= times_.peer_wait_s)
      continue;
    const int from = pipe.lowered.rank_of(fwd ? t.action.stage - 1 : t.action.stage + 1);
    times_.peer = comms_.pp->world_rank_of(from);
    times_.peer_wait_s = t.t_end_s - t.t_begin_s;
  }
}

}  // namespace trident::train
