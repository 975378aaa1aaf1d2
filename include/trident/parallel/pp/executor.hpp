// Pipeline executor: runs one rank's list of a lowered schedule on real stage
// functions over the pp communicator.
//
// Receives are posted ahead (for the next `recv_lookahead` compute actions)
// so data lands while the rank computes, except on a communicator whose
// point-to-point runs in posting order without tags (in_order_p2p: NCCL),
// where a receive posted in the wrong place holds the stream in front of
// the messages its sender waits for: there every rank posts its messages in
// one order that all ranks derive from the schedule (each message keyed by
// its send time in a replay of the schedule), which cannot deadlock
// (tests/unit/pp/test_executor_in_order checks every schedule on such a
// communicator). Sends are non-blocking; their
// buffers are released when the send completes, tested while a RECV waits
// (and at the end), never between compute actions. A stage's input stays alive
// until its last backward for that micro-batch (B, or W when split) has run,
// then it is freed: that is the in-flight activation count. Weight gradients
// accumulate across micro-batches inside the PipelineStage. Every action is
// timed (one clock for all ranks, now_s()); bytes and wait time go to the pp
// counters through Communicator.
#pragma once
#include <cstdint>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/profiler.hpp"
#include "trident/core/tensor.hpp"
#include "trident/io/timeline_event.hpp"
#include "trident/parallel/pp/schedule.hpp"

namespace trident::pp {

// What the executor drives on one rank: the rank's vpp model chunks.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  // Floats of the activation `chunk` SENDS forward for `microbatch` (= the
  // gradient it receives back). The receiver sizes its buffer by asking its
  // own PipelineStage for the sending stage's chunk, so every rank must answer
  // for every chunk index in [0, vpp) (in a transformer every boundary is
  // micro_batch x seq x d_model).
  virtual int64_t boundary_numel(int chunk, int microbatch) = 0;
  // Where boundary buffers come from: the stage's device (the host by default).
  virtual Allocator& allocator() { return cpu_allocator(); }
  // F. input: activation from the previous virtual stage (empty for virtual
  // stage 0); the executor does not write to it again, so the stage may keep
  // it (a shared handle) instead of a copy. output: a buffer of
  // boundary_numel(chunk, microbatch) floats to fill (empty for the last
  // virtual stage, which computes the loss).
  virtual void forward(int chunk, int microbatch, const Tensor& input, Tensor& output) = 0;
  // B. grad_output: gradient from the next virtual stage (empty for the
  // last: the loss starts it). grad_input: fill (empty for virtual stage 0).
  // weight_grad == true: also accumulate the weight gradients (schedules
  // without a B/W split); false: defer them to backward_weight.
  virtual void backward(int chunk, int microbatch, const Tensor& grad_output, Tensor& grad_input,
                        bool weight_grad) = 0;
  virtual void backward_weight(int chunk, int microbatch) = 0;  // W of a split schedule
  // After F of a forward-only schedule: no backward follows, so what the
  // forward kept for one can go.
  virtual void discard_forward(int /*chunk*/, int /*microbatch*/) {}
};

struct ActionTiming {
  Action action;
  double t_begin_s = 0, t_end_s = 0;  // now_s(); a RECV spans its wait
};

struct ExecResult {
  double makespan_s = 0;       // first action begin to last action end over all pp ranks
                               // (as in the simulator: entry and the final send wait excluded)
  double busy_s = 0;           // this rank's time in F, B, W
  double bubble_fraction = 0;  // 1 - busy_s / makespan_s
  int peak_inflight = 0;       // most (chunk, micro-batch) inputs alive at once
  double elapsed_s = 0;        // this rank: entry to the last send completing
  double recv_wait_s = 0;      // inside RECV actions (waiting for peers)
  double send_s = 0;           // inside SEND actions and the final wait for sends
  double overhead_s = 0;       // elapsed - busy - recv_wait - send: the executor's own cost
  int64_t bytes_sent = 0;
  // Overlapped F+B slots run as two lanes (ExecOptions::overlap_pairs), the
  // EP exchanges posted inside them, and of those the ones during which
  // the other lane computed (core/overlap.hpp's PairStats).
  int overlapped_pairs = 0;
  int64_t overlap_exchanges = 0, overlap_hidden = 0;
  std::vector<ActionTiming> actions;  // this rank's, in list order (a pair's F and B may overlap)
};

struct ExecOptions {
  int recv_lookahead = 2;  // post receives needed by this many upcoming compute actions
  // A RECV may poll its request, yielding the core between polls, for up to
  // this long before Communicator::wait (deadline, backoff that ends in 50 us
  // sleeps) takes over; the deadline is then recv_poll_s + timeout. 0: the
  // Communicator's wait from the start. Polling shortens a hop only when cores
  // are free; in CPU-bound training on oversubscribed cores the pollers take
  // the cores from ranks that compute (quickstart, 8 ranks on 2 cores: 4.8-6.8k
  // tokens/s with 0.1 s against 7.5-9.4k with 0), and in bench schedule it made
  // no measurable difference.
  double recv_poll_s = 0.0;
  // Every action as a span (kind = op name, stage, chunk, micro-batch), in
  // execution order, once the step is done.
  prof::Sink* profiler = nullptr;
  // An overlapped F+B slot (DualPipeV's; Action::overlapped) whose B is on
  // another chunk runs as two lanes that take turns where an EP exchange is
  // in flight (core/overlap.hpp): one micro-batch's all-to-all is posted
  // before the other's compute and completed after it. Each lane computes
  // what it computes alone, bit for bit. false: F, its sends, then B, one
  // after the other (runtime.ep_overlap = false).
  bool overlap_pairs = true;
};

// Runs rank `my_pp_rank`'s list of `lowered` (validate()d by the caller or
// here). Collective over pp: ends with one allreduce for the makespan. Appends
// one event per action to timeline if given (rank = world rank, kind = op
// name). Throws TimeoutError through Communicator if a peer never delivers.
ExecResult execute(const Schedule& lowered, int my_pp_rank, PipelineStage& stage, Communicator& pp,
                   int step, std::vector<TimelineEvent>* timeline, const ExecOptions& options = {});
// The same; pp may be null when lowered.pp == 1 (one rank, or a stage whose pp
// group is itself): nothing is sent, the makespan is this rank's.
ExecResult execute(const Schedule& lowered, int my_pp_rank, PipelineStage& stage, Communicator* pp,
                   int step, std::vector<TimelineEvent>* timeline, const ExecOptions& options = {});

// Tag of the message (sending stage, micro-batch, direction): distinct for
// every message of one step.
int message_tag(const Schedule& s, int sending_stage, int microbatch, bool backward);

}  // namespace trident::pp
