// The EP tests' scaffolding: one builder of an MoE layer's ModelConfig
// instead of a copy per test file, and tensors over the tests' host
// vectors for the ep API (which takes tensors; Tensor::borrow wraps the
// vectors, nothing is copied).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/functional.hpp"

namespace trident::testing {

// One MoE layer's shape and routing. Defaults: d 16, f 24, 8 experts of
// which 2 per token, init_std 0.5 (large enough that the routing is not
// uniform); the router's fields keep ModelConfig's defaults.
struct TinyMoE {
  int d_model = 16;
  int ffn = 24;
  int experts = 8;
  int top_k = 2;
  double init_std = 0.5;
  double aux_loss = ModelConfig{}.aux_loss_coef;
  double z_loss = ModelConfig{}.z_loss_coef;
  double capacity = ModelConfig{}.capacity_factor;  // 0: dropless
  RouterScoring router = ModelConfig{}.router;
  bool norm_topk = ModelConfig{}.norm_topk;
};

inline ModelConfig moe_layer_config(const TinyMoE& m) {
  ModelConfig c;
  c.d_model = m.d_model;
  c.ffn_hidden = m.ffn;
  c.n_experts = m.experts;
  c.top_k = m.top_k;
  c.init_std = m.init_std;
  c.aux_loss_coef = m.aux_loss;
  c.z_loss_coef = m.z_loss;
  c.capacity_factor = m.capacity;
  c.router = m.router;
  c.norm_topk = m.norm_topk;
  return c;
}

// The host vector v as f32 rows [v.size() / d, d] (an op may write them:
// pass a const vector only where the op reads).
inline Tensor host_rows(const std::vector<float>& v, int64_t d) {
  return Tensor::borrow(const_cast<float*>(v.data()), {int64_t(v.size()) / d, d}, Device::cpu());
}
// n rows of d starting at row `first` of v.
inline Tensor host_rows(const std::vector<float>& v, int64_t first, int64_t n, int64_t d) {
  return host_rows(v, d).rows(first, first + n);
}
// v as one f32 dimension [v.size()] (routing weights, their gradients).
inline Tensor host_flat(const std::vector<float>& v) {
  return Tensor::borrow(const_cast<float*>(v.data()), {int64_t(v.size())}, Device::cpu());
}

// Row r (of d floats) of host row blocks, as an unpermute reads it: the
// one block, or the block b with first[b] <= r < first[b + 1].
inline const float* block_row(const kernels::RowBlocks& rows, int64_t r, int64_t d) {
  if (rows.blocks.empty()) return rows.rows.ptr() + r * d;
  const auto b =
      std::upper_bound(rows.first.begin() + 1, rows.first.end(), r) - (rows.first.begin() + 1);
  return rows.blocks[size_t(b)].ptr() + (r - rows.first[size_t(b)]) * d;
}

}  // namespace trident::testing
