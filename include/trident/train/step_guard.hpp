// The step guards' helpers: where a non-finite gradient first appeared
// (train.on_nonfinite), the loss-spike warning (train.loss_spike_factor) and
// the bitwise comparison of a re-executed step (runtime.verify_every).
//
// A NaN on one rank reaches every replica through the gradient reduction, so
// the place it came from is only visible in this rank's own gradients before
// the reduction; "first" is model order (embedding, layers.0, layers.1, ...,
// the final norm and head), then the lowest rank.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "trident/core/param.hpp"
#include "trident/kernels/context.hpp"

namespace trident::train {

// The place of a parameter in model order: -1 for the embedding, L for
// "layers.L.*", n_layers for what follows the last layer.
int model_order_of(const std::string& param_name, int n_layers);

// "layers.2.attn.wq (layer 2)", "embedding (before layer 0)", ...
std::string describe_param(const std::string& param_name, int n_layers);

// This rank's first parameter (model order, then position in params) whose
// gradient holds a NaN or an infinity; -1: none. Gradients on a device are
// judged there (their sums of squares, accumulated in double, are finite
// exactly when every element is), all in one op whose sums reach the host in
// one copy: one wait per call, not one per parameter.
int first_nonfinite_gradient(const kernels::Ctx& ctx, const std::vector<Param*>& params,
                             int n_layers);

// A key that orders (model order, rank) for an allreduce_min across ranks;
// kNoKey when this rank found nothing.
constexpr int64_t kNoKey = INT64_MAX;
int64_t nonfinite_key(int order, int rank, int world_size);
int rank_of_key(int64_t key, int world_size);

// Warns when a loss exceeds `factor` times the median of the last `window`
// finite losses (once `min_steps` are known).
class LossSpikeDetector {
 public:
  explicit LossSpikeDetector(double factor, size_t window = 20, size_t min_steps = 5)
      : factor_(factor), window_(window), min_steps_(min_steps) {}
  // Feeds a finite loss; returns the running median it exceeds by the factor,
  // or 0 when it does not (or the detector is off).
  double add(double loss);

 private:
  double factor_;
  size_t window_, min_steps_;
  std::deque<double> recent_;
};

// A copy of gradients and loss sums, compared bitwise with a later pass.
class StepSnapshot {
 public:
  // Gradients on a device are copied to the host explicitly (on ctx).
  void take(const kernels::Ctx& ctx, const std::vector<Param*>& params,
            const std::vector<double>& sums);
  // True when every gradient and sum equals the snapshot bit for bit.
  bool same_bits(const kernels::Ctx& ctx, const std::vector<Param*>& params,
                 const std::vector<double>& sums) const;

 private:
  std::vector<float> grads_;
  std::vector<double> sums_;
};

}  // namespace trident::train
