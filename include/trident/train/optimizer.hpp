// AdamW over named parameters, and the learning-rate schedule.
//
// The moments are kept per parameter name, so a checkpoint written by one
// mesh restores into another (each rank takes the names it holds).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/param.hpp"
#include "trident/kernels/context.hpp"

namespace trident::train {

// Linear warmup over warmup_steps (step 0 gets lr / warmup_steps), then cosine
// decay to lr * min_lr_ratio at the last step. step counts from 0.
double learning_rate(const TrainConfig& t, int64_t step);

class AdamW {
 public:
  // The updates run as kernels on ctx (default: the host), and the moments
  // live on ctx's device, from its allocator.
  AdamW(std::vector<Param*> params, const TrainConfig& t, const kernels::Ctx& ctx = {});
  // One update of every parameter with gradients multiplied by grad_scale.
  void step(double lr, float grad_scale);
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  const std::vector<Param*>& params() const { return params_; }
  Tensor& m(const std::string& name) { return state_.at(name).first; }
  Tensor& v(const std::string& name) { return state_.at(name).second; }

 private:
  kernels::Ctx ctx_;
  std::vector<Param*> params_;
  TrainConfig cfg_;
  int64_t t_ = 0;
  std::map<std::string, std::pair<Tensor, Tensor>> state_;
};

}  // namespace trident::train
