// Param: one trainable tensor with its gradient and how that gradient is
// reduced across the mesh.
//
// Names are global ("layers.3.moe.experts.5.w_up"), and values are
// initialised from the counter-based RNG keyed by (name, global element
// index): a rank holding experts 4..7 of 8 gets exactly the values the
// one-rank run has for them. Checkpoints and the optimizer key on names.
#pragma once
#include <string>

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
  void init_constant(float c) { value.fill(c); }
};

}  // namespace trident
