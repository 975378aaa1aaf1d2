// The decoder-only MoE transformer, cut into pipeline chunks.
//
//   tokens -> embedding -> n_layers x [ RMSNorm -> attention (QKV, q/k head
//   RMSNorm when model.qk_norm, RoPE at global positions, causal attention
//   over the whole sequence through the CP ring, output projection) ->
//   residual -> RMSNorm -> FFN (MoE on every moe_every-th layer not in
//   dense_layers, dense SwiGLU otherwise) -> residual ] -> RMSNorm ->
//   LM head (the embedding table when model.tie_embeddings) -> cross-entropy
//
// The layers are split over pp * vpp virtual stages (contiguous ranges, the
// first stages take one more layer when it does not divide); which rank holds
// which stage is the schedule's placement (c * pp + r is chunk c of rank r in
// the loop placement; rank r holds r and 2 pp - 1 - r in the V placement of
// ZB-V and DualPipeV). A ModelStage holds this rank's
// chunks and runs forward/backward of one (chunk, micro-batch) at a time, so
// any pipeline schedule can drive it; it keeps one activation cache per
// micro-batch in flight. Stage boundaries carry hidden states [tokens, d] and
// their gradients.
//
// Loss: the last virtual stage returns nothing downstream; it adds the SUM of
// its token losses to loss_sum() and seeds the backward with
// loss_scale = 1 / (target tokens of the global batch), so that summing the
// gradients over dp x cp gives the gradient of the global mean loss.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"
#include "trident/core/param.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"
#include "trident/model/data.hpp"
#include "trident/parallel/cp/ring_attention.hpp"

namespace trident::model {

// One micro-batch as this rank sees it: micro_batch_size samples, each with
// the rank's local tokens (seq_len / cp of them, at global `positions`).
// make_microbatches fills the host vectors; ModelStage::begin_step puts
// tokens, targets and positions on the stage's device once per micro-batch
// (`on_device`), and the kernels read only those.
struct MicroBatch {
  int64_t n_samples = 0;
  int64_t local_seq = 0;
  std::vector<int32_t> tokens;      // [n_samples * local_seq]
  std::vector<int32_t> targets;     // same; -1: no loss
  std::vector<int64_t> positions;   // [local_seq] global positions (same for every sample)
  std::vector<int64_t> sample_ids;  // [n_samples] global sample index in the step's batch
  // Packed documents (Sample::doc_ids / positions, cut to this rank's
  // tokens); both empty when the samples carry none: one document per
  // sample, RoPE at the global positions.
  std::vector<int32_t> doc_ids;         // [n_samples * local_seq] document of each token
  std::vector<int64_t> rope_positions;  // [n_samples * local_seq] RoPE position of each token
  // parallel.cp_layout = "docs": each packed sample has its own layout over
  // the cp ring. layouts [n_samples] (empty for a sample without documents,
  // which keeps `positions`); seq_positions [n_samples * local_seq] each
  // token's global position. Both empty under a fixed layout.
  std::vector<cp::SeqLayout> layouts;
  std::vector<int64_t> seq_positions;
  struct OnDevice {
    Tensor tokens, targets;  // i32 [n_samples * local_seq]
    Tensor positions;        // i64 [local_seq]
    Tensor sample_of_token;  // i32 [n_samples * local_seq]: each token's sample
    Tensor token_index;      // i64 [n_samples * local_seq]: sample * seq_len + global position
    Tensor doc_ids;          // i32 [n_samples * local_seq], or empty
    Tensor rope_positions;   // i64 [n_samples * local_seq], or empty
  } on_device;
  int64_t tokens_total() const { return n_samples * local_seq; }
};

// parallel.cp_layout = "docs" on a ring of cp > 1 ranks: rank `rank` takes
// the runs cp::balance_documents gives it for each packed sample. cp = 1:
// off (every sample uses the fixed positions).
struct DocumentBalance {
  int cp = 1, rank = 0;
  int64_t window = 0;  // model.window
};

// This rank's micro-batches of a step: dp rank dp_rank's slice of the global
// batch, each sample cut to the tokens at `positions` (its cp share), or, for
// a packed sample under by_docs, to the tokens of its own layout (and then
// rope_positions is filled for every sample).
std::vector<MicroBatch> make_microbatches(const DataSource& data, const DataConfig& d, int64_t step,
                                          int dp_rank, const std::vector<int64_t>& positions,
                                          const DocumentBalance& by_docs = {});

// Group communicators a stage needs (null: that parallelism is off, size 1).
struct StageComms {
  Communicator* cp = nullptr;
  Communicator* ep = nullptr;
};

// Which activations to keep during this step's forward (output.activation_*).
struct CaptureRequest {
  std::set<int> layers;
  std::set<int64_t> samples;
  std::set<std::string> names;
  // The LM head's output of `samples` (trident eval --logits-out): a
  // Capture named "logits", layer -1, width vocab_size, on the last stage.
  bool logits = false;
  bool active() const { return !layers.empty() && !samples.empty() && !names.empty(); }
};

// Captured rows of one (layer, name, sample): [local_seq, width] in local order.
struct Capture {
  int layer = 0;
  std::string name;
  int64_t sample = 0;
  int64_t width = 0;  // floats per token (H*D, Hkv*D or n_experts)
  std::vector<float> rows;
  // Global position of each row when the sample has its own layout
  // (MicroBatch::seq_positions, parallel.cp_layout = "docs"); empty: the
  // rank's fixed positions.
  std::vector<int64_t> positions;
};

// Layer range [begin, end) of virtual stage vs out of n_virtual: layout[vs]
// layers after those of the stages before it (parallel.pp_layout, n_virtual
// entries), or an even split (the first n_layers % n_virtual stages one more)
// when layout is empty.
std::pair<int, int> layer_range(int n_layers, int n_virtual, int vs,
                                const std::vector<int>& layout = {});

class Chunk;          // one virtual stage's layers (model/transformer.cpp)
class GemmPrecision;  // what GEMMs read under train.precision (model/blocks.hpp)

// One attention call on this rank: when it began and how long this rank spent
// in the attention kernels during it (ring waits excluded), so that per-rank
// attention compute (the zig-zag balance) can be read from the timeline.
struct AttnSpan {
  double t_begin_s = 0, compute_s = 0;
  int layer = 0;
  bool backward = false;
};

class ModelStage {
 public:
  // pp_rank/pp, vpp from the mesh and config; stages: the virtual stages this
  // rank holds, ascending (chunk c is stages[c]), from the schedule's
  // placement; empty: the loop placement (chunk c is stage c * pp + pp_rank).
  // Builds and initialises the parameters of this rank's chunks (counter-RNG,
  // same on every mesh). Every kernel of the stage runs with ctx (default:
  // the host, scratch allocated per call).
  ModelStage(const Config& cfg, int pp_rank, int pp, StageComms comms,
             const std::vector<int>& stages = {}, const kernels::Ctx& ctx = {});
  ~ModelStage();
  ModelStage(const ModelStage&) = delete;
  ModelStage& operator=(const ModelStage&) = delete;

  int n_chunks() const;
  bool is_first(int chunk) const;  // holds the embedding (virtual stage 0)
  bool is_last(int chunk) const;   // holds the head and the loss
  std::vector<Param*> params();

  // Micro-batches of this step; loss_scale = 1/(global target tokens),
  // aux_scale = 1 / (sequences of the global batch) (the MoE layer applies
  // aux_loss_coef itself).
  void begin_step(std::vector<MicroBatch> mbs, float loss_scale, float aux_scale,
                  const CaptureRequest* capture);
  int n_microbatches() const { return static_cast<int>(mbs_.size()); }

  // Floats crossing a stage boundary for micro-batch mb: tokens * d_model.
  int64_t boundary_numel(int chunk, int mb) const;
  // Where the stage's activations and boundary buffers come from (its Ctx's).
  Allocator& allocator() const;
  // input: empty for the first chunk (tokens come from the micro-batch),
  // else [boundary_numel] floats, kept (shared, not copied) until the
  // micro-batch's backward; output: empty for the last chunk (the loss is
  // accumulated instead), else filled.
  void forward(int chunk, int mb, const Tensor& input, Tensor& output);
  // grad_output: empty for the last chunk; grad_input: empty for the first,
  // else filled. weight_grad = false (zero-bubble B): only input gradients
  // now; the linear layers' weight gradients are stashed (sharing the
  // gradient tensors) for backward_weight().
  void backward(int chunk, int mb, const Tensor& grad_output, Tensor& grad_input, bool weight_grad);
  void backward_weight(int chunk, int mb);
  // Forward-only schedules: drops what forward kept of micro-batch mb for
  // its backward.
  void discard_forward(int chunk, int mb);
  // Told the parameters whose gradient of one micro-batch is complete: after
  // each layer's backward (and the head's, the embedding's) in B, or all of
  // a chunk's after its W when B deferred the weight gradients. Each
  // parameter is reported once per micro-batch. The bucketed gradient
  // reduction starts from it (parallel/dp/grad_buckets.hpp); null: nobody.
  using GradsReady = std::function<void(const std::vector<Param*>&)>;
  void set_grads_ready(GradsReady fn) { grads_ready_ = std::move(fn); }

  // This step's sums on this rank: token losses (last stage only) and the
  // MoE load-balancing loss and router z-loss (sums over sequences, unscaled;
  // both are trained through aux_scale).
  double loss_sum() const { return loss_sum_; }
  double aux_sum() const { return aux_sum_; }
  double z_sum() const { return z_sum_; }
  // Tokens routed to each expert in this step by this rank, [moe layer][expert]
  // over all MoE layers of the model (zeros for layers not held here).
  const std::vector<std::vector<int64_t>>& expert_tokens() const { return expert_tokens_; }
  std::vector<Capture> take_captures();
  // Attention calls of this step on this rank (emptied by the call).
  std::vector<AttnSpan> take_attention_spans() { return std::exchange(attn_spans_, {}); }
  // Router bias update (sigmoid_bias) from the step's globally summed loads.
  void update_router_bias(const std::vector<std::vector<int64_t>>& global_load);
  // Extra state that is not a Param but belongs in a checkpoint (router
  // biases), by global name.
  std::vector<std::pair<std::string, Tensor*>> buffers();
  // After writing restored values into buffers(): pass them to their layers.
  void buffers_loaded();

 private:
  friend class Chunk;
  Config cfg_;
  int pp_rank_, pp_;
  StageComms comms_;
  kernels::Ctx ctx_;
  std::unique_ptr<GemmPrecision> precision_holder_;
  GemmPrecision& precision_;
  std::unique_ptr<Param> tied_embedding_;  // model.tie_embeddings: embedding and LM head
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<MicroBatch> mbs_;
  float loss_scale_ = 1, aux_scale_ = 0;
  const CaptureRequest* capture_ = nullptr;
  double loss_sum_ = 0, aux_sum_ = 0, z_sum_ = 0;
  std::vector<std::vector<int64_t>> expert_tokens_;
  std::vector<Capture> captures_;
  std::vector<AttnSpan> attn_spans_;
  GradsReady grads_ready_;
  std::map<int, int> tied_parts_;  // micro-batch -> parts of the tied table's gradient reported
};

}  // namespace trident::model
