// Param: one trainable tensor with its gradient and how that gradient is
// reduced across the mesh.
//
// Names are global ("layers.3.moe.experts.5.w_up"), and values are
// initialised from the counter-based RNG keyed by (name, global element
// index): a rank holding experts 4..7 of 8 gets exactly the values the
// one-rank run has for them. Checkpoints and the optimizer key on names.
//
// Every weight matrix is stored [out, in] (y = x·Wᵀ, as nn.Linear and
// Megatron store them). The init key is the element's index in the order
// the weight's values were first defined in, so that a layout change keeps
// every weight's values: the attention and head projections are keyed by
// their [out, in] index (init_normal), the SwiGLU weights (w_gate, w_up,
// w_down) and the MoE router by the index of the same element in [in, out]
// order (init_normal_in_out_keyed).
#pragma once
#include <string>

#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/core/tensor.hpp"

namespace trident {

enum class GradReduce {
  dense,   // summed over dp x cp (every rank of the stage holds it)
  expert,  // summed over the (dp*cp)/ep replicas of that expert
  none,    // not reduced (e.g. not trainable)
};

struct Param {
  std::string name;
  Tensor value;
  Tensor grad;
  GradReduce reduce = GradReduce::dense;
  bool decay = true;  // weight decay applies (not to norms)

  Param() = default;
  Param(std::string n, std::vector<int64_t> shape, GradReduce r = GradReduce::dense)
      : name(std::move(n)), value(shape), grad(shape), reduce(r) {}

  // value[i] = std * normal(hash(name), global_offset + i): global_offset is
  // where this rank's slice starts in the full parameter.
  void init_normal(float std, uint64_t global_offset = 0) {
    rng::fill_normal(value.ptr(), value.numel(), rng::hash_name(name), global_offset, std);
  }
  // A whole [out, in] weight keyed in [in, out] order:
  // value[o, i] = std * normal(hash(name), i * out + o).
  void init_normal_in_out_keyed(float std) {
    TRIDENT_CHECK(value.ndim() == 2, "init_normal_in_out_keyed: " + name + " is not a matrix");
    const int64_t out = value.dim(0), in = value.dim(1);
    const uint64_t key = rng::hash_name(name);
    float* v = value.ptr();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        v[o * in + i] = std * rng::normal(key, static_cast<uint64_t>(i * out + o));
  }
  void init_constant(float c) { value.fill(c); }
};

}  // namespace trident
