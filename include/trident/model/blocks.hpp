// The pieces a transformer chunk is assembled from, behind small interfaces
// so that the serial and the parallel versions are interchangeable:
//   AttentionCore  causal attention of one sequence on this rank's tokens
//                  (local kernel with cp = 1, RingAttention over the cp group)
//   FeedForward    dense SwiGLU or the expert-parallel MoE layer
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/param.hpp"
#include "trident/core/tensor.hpp"
#include "trident/model/transformer.hpp"

namespace trident::model {

// Attention of ONE sequence: q [Ls, H, D], k/v [Ls, Hkv, D] (this rank's
// tokens, in local order, RoPE applied), out [Ls, H, D], lse [Ls, H].
class AttentionCore {
 public:
  virtual ~AttentionCore() = default;
  // Where each call's kernel time is recorded (the timeline's ATTN_F/ATTN_B
  // events); null: not recorded. `layer` labels the records.
  std::vector<AttnSpan>* spans = nullptr;
  int layer = 0;
  virtual void forward(const float* q, const float* k, const float* v, int64_t Ls, float* out,
                       float* lse) = 0;
  // dq/dk/dv are overwritten.
  virtual void backward(const float* q, const float* k, const float* v, int64_t Ls,
                        const float* out, const float* lse, const float* dout, float* dq,
                        float* dk, float* dv) = 0;
};

// Local kernel when cp is off, RingAttention over comms.cp otherwise.
std::unique_ptr<AttentionCore> make_attention_core(const Config& cfg, const StageComms& comms);

// Global positions of this rank's tokens of one sequence (cp layout).
std::vector<int64_t> local_positions(const Config& cfg, const StageComms& comms);

// What an FFN forward hands back besides its output.
struct FfnStats {
  double aux_loss_sum = 0;                  // MoE: load-balancing loss, sum over this rank's sequences
  double z_loss_sum = 0;                    // MoE: router z-loss, the same way
  int moe_index = -1;                       // which MoE layer (0-based), -1 dense
  std::vector<int64_t> tokens_per_expert;   // MoE: this rank's routed copies per expert
  bool capture_router_logits = false;       // asked for by the caller
  std::vector<float> router_logits;         // [T, n_experts] when asked
};

// What an FFN keeps between forward and backward beyond gate and up (the
// MoE layer's cache), owned by the FfnCache.
struct FfnState {
  virtual ~FfnState() = default;
};

// Per-micro-batch state an FFN keeps between forward and backward.
struct FfnCache {
  const float* x = nullptr;  // the FFN input (owned by the enclosing block's cache)
  Tensor gate, up;           // dense SwiGLU pre-activations
  std::unique_ptr<FfnState> moe;  // the MoE layer's own cache
};

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  virtual std::vector<Param*> params() = 0;
  // x [T, d] -> y [T, d] (overwritten).
  virtual void forward(const MicroBatch& mb, const float* x, int64_t T, float* y, FfnCache& c,
                       FfnStats& stats) = 0;
  // dx overwritten; weight gradients accumulated. aux_scale: d(loss)/d(aux sum).
  virtual void backward(const float* dy, float* dx, int64_t T, FfnCache& c, float aux_scale) = 0;
  // sigmoid_bias routing: nudge the bias from the global per-expert loads
  // ([moe layer][expert]); dense FFNs ignore it.
  virtual void update_bias(const std::vector<std::vector<int64_t>>& global_load) {}
  // Non-parameter state to checkpoint (router bias), by global name.
  virtual std::vector<std::pair<std::string, Tensor*>> buffers() { return {}; }
  // After a checkpoint wrote into buffers(): hand the values to whoever uses them.
  virtual void buffers_loaded() {}
};

std::unique_ptr<FeedForward> make_dense_ffn(const ModelConfig& m, int layer);
std::unique_ptr<FeedForward> make_moe_ffn(const Config& cfg, int layer, const StageComms& comms);

}  // namespace trident::model
