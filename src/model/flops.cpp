// FLOPs of one training step (see trident/model/flops.hpp).
#include "trident/model/flops.hpp"

namespace trident::model {

double step_model_flops(const Config& cfg, double sequences) {
  const ModelConfig& mc = cfg.model;
  const double d = mc.d_model, HD = double(mc.n_heads) * mc.head_dim(),
               KD = double(mc.n_kv_heads) * mc.head_dim(), S = cfg.data.seq_len;
  double per_token = 0;  // forward matmul FLOPs per token
  for (int l = 0; l < mc.n_layers; ++l) {
    per_token += 2 * d * (2 * HD + 2 * KD);
    per_token += mc.is_moe_layer(l)
                     ? 2 * d * mc.n_experts + 6.0 * mc.top_k * d * mc.expert_ffn_hidden()
                     : 6 * d * mc.ffn_hidden;
  }
  per_token += 2 * d * mc.vocab_size;
  const double attention = mc.n_layers * (S * (S + 1) / 2) * 4 * HD;  // per sequence, forward
  return 3 * sequences * (S * per_token + attention);
}

}  // namespace trident::model
