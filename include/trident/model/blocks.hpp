// The pieces a transformer chunk is assembled from, behind small interfaces
// so that the serial and the parallel versions are interchangeable:
//   AttentionCore  causal attention of one sequence on this rank's tokens
//                  (local kernel with cp = 1, RingAttention over the cp group)
//   FeedForward    dense SwiGLU or the expert-parallel MoE layer
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/param.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/types/gemm_bf16.hpp"
#include "trident/model/transformer.hpp"

namespace trident::model {

// What the GEMMs and attention of a stage read (train.precision): under
// fp32 the master weights and f32 activations; under bf16, the weights that
// GEMMs read as bf16 (refreshed from the fp32 masters by refresh(), at each
// step's start) and bf16 activations wherever a GEMM or attention reads
// them. Everything else stays f32 (config-reference.md, precision).
// A bf16 weight is either a bf16 copy of its master, or, on the CPU's
// native bf16 path, its master packed for the native GEMM (rounded as it is
// packed: the copy's words) with no copy, the ops taking the packed form
// beside the master (functional.hpp's packed operand; planner.md).
class GemmPrecision {
 public:
  GemmPrecision(const kernels::Ctx& ctx, Precision p) : ctx_(ctx), bf16_(p == Precision::bf16) {}
  bool bf16() const { return bf16_; }
  // Registers a weight that GEMMs read (its copy or packed form is made under bf16).
  void add(const Param& p);
  // The tensor a GEMM reads for p: p.value, or its bf16 copy.
  const Tensor& weight(const Param& p) const;
  // p's packed form, to pass with weight(p) (null: none, the ops pack as they go).
  const kernels::PackedBf16Weight* packed(const Param& p) const;
  // p's packed forms as a SwiGLU takes them.
  kernels::SwigluPacked packed(const Param& gate, const Param& up, const Param& down) const {
    return {packed(gate), packed(up), packed(down)};
  }
  // Converts every registered master weight into its copy or packed form (bf16 only).
  void refresh();
  // A new activation that a GEMM or attention reads: bf16 under bf16.
  Tensor activation(std::vector<int64_t> shape) const;

 private:
  kernels::Ctx ctx_;
  bool bf16_;
  std::unordered_map<const Param*, Tensor> copies_;  // by master (every expert's too)
  // The masters packed for the CPU's native bf16 GEMM (those with forms; no copy then).
  std::unordered_map<const Param*, std::unique_ptr<kernels::PackedBf16Weight>> packed_;
};

// The packed documents of one sequence on this rank: each local token's
// document id, on the stage's device (i32 [Ls], what the kernels read) and
// the same ids on the host (what decides which ring blocks are skipped and
// what is sent along with them). Both empty: one document. layout: the
// sequence's own cp layout (parallel.cp_layout = "docs"), or null.
struct SeqDocs {
  Tensor device;
  const int32_t* host = nullptr;
  const cp::SeqLayout* layout = nullptr;
  bool packed() const { return host != nullptr; }
};

// Attention of ONE sequence: q [Ls, H, D], k/v [Ls, Hkv, D] (this rank's
// tokens, in local order, RoPE applied), out [Ls, H, D], lse [Ls, H].
// Causal on the sequence positions, inside each document of `docs`, and
// within model.window positions when that is set.
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // Where each call's kernel time is recorded (the timeline's ATTN_F/ATTN_B
  // events); null: not recorded. `layer` labels the records.
  std::vector<AttnSpan>* spans = nullptr;
  int layer = 0;
  // Views of one sequence's rows: q/out/dout/dq [Ls, H*D], k/v/dk/dv
  // [Ls, Hkv*D], lse [Ls, H], all on the stage's device.
  virtual void forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t Ls,
                       const Tensor& out, const Tensor& lse, const SeqDocs& docs) = 0;
  // dq/dk/dv are overwritten.
  virtual void backward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t Ls,
                        const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                        const Tensor& dk, const Tensor& dv, const SeqDocs& docs) = 0;
};

// Local kernel when cp is off, RingAttention over comms.cp otherwise.
std::unique_ptr<AttentionCore> make_attention_core(const kernels::Ctx& ctx, const Config& cfg,
                                                   const StageComms& comms);

// Global positions of this rank's tokens of one sequence (cp layout; with
// "docs", those of a sequence without documents).
std::vector<int64_t> local_positions(const Config& cfg, const StageComms& comms);

// parallel.cp_layout = "docs" on a ring of cp > 1 ranks: this rank's place in
// it (make_microbatches); otherwise cp = 1 (off).
DocumentBalance document_balance(const Config& cfg, const StageComms& comms);

// What an FFN forward hands back besides its output.
struct FfnStats {
  double aux_loss_sum = 0;  // MoE: load-balancing loss, sum over this rank's sequences
  double z_loss_sum = 0;    // MoE: router z-loss, the same way
  int moe_index = -1;       // which MoE layer (0-based), -1 dense
  std::vector<int64_t> tokens_per_expert;  // MoE: this rank's routed copies per expert
  bool capture_router_logits = false;      // asked for by the caller
  std::vector<float> router_logits;        // [T, n_experts] when asked
};

// What an FFN keeps between forward and backward beyond gate and up (the
// MoE layer's cache), owned by the FfnCache.
struct FfnState {
  virtual ~FfnState() = default;
};

// Per-micro-batch state an FFN keeps between forward and backward.
struct FfnCache {
  Tensor x;                       // the FFN input (shared with the enclosing block's cache)
  Tensor gate, up;                // dense SwiGLU pre-activations
  std::unique_ptr<FfnState> moe;  // the MoE layer's own cache
};

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  virtual std::vector<Param*> params() = 0;
  // Whether forward takes its input in bf16 (GemmPrecision::activation);
  // false: f32 whatever the precision.
  virtual bool reads_bf16() const { return false; }
  // Selective recompute: drop() releases what the forward kept that
  // recompute() can make again from FfnCache::x alone (the SwiGLU gate and up
  // activations, the input itself); recompute() runs, with c.x set again,
  // before the backward and gives the same bits as the forward (the same
  // kernels on the same inputs). What needs an exchange (the MoE layer's
  // rows, routing and plan) is kept.
  virtual void drop(FfnCache& c) = 0;
  virtual void recompute(FfnCache& c) = 0;
  // x [T, d] -> y [T, d] (overwritten).
  virtual void forward(const MicroBatch& mb, const Tensor& x, const Tensor& y, FfnCache& c,
                       FfnStats& stats) = 0;
  // dx overwritten; weight gradients accumulated. aux_scale: d(loss)/d(aux sum).
  virtual void backward(const Tensor& dy, const Tensor& dx, FfnCache& c, float aux_scale) = 0;
  // sigmoid_bias routing: nudge the bias from the global per-expert loads
  // ([moe layer][expert]); dense FFNs ignore it.
  virtual void update_bias(const std::vector<std::vector<int64_t>>& global_load) {}
  // Non-parameter state to checkpoint (router bias), by global name.
  virtual std::vector<std::pair<std::string, Tensor*>> buffers() { return {}; }
  // After a checkpoint wrote into buffers(): hand the values to whoever uses them.
  virtual void buffers_loaded() {}
};

std::unique_ptr<FeedForward> make_dense_ffn(const kernels::Ctx& ctx, const ModelConfig& m,
                                            int layer, GemmPrecision& precision);
std::unique_ptr<FeedForward> make_moe_ffn(const kernels::Ctx& ctx, const Config& cfg, int layer,
                                          const StageComms& comms, GemmPrecision& precision);

}  // namespace trident::model
