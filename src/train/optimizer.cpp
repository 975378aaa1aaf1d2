// AdamW state and the warmup + cosine learning rate.
#include "trident/train/optimizer.hpp"

#include <cmath>

#include "trident/kernels/ops.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::train {

double learning_rate(const TrainConfig& t, int64_t step) {
  if (t.warmup_steps > 0 && step < t.warmup_steps)
    return t.lr * double(step + 1) / double(t.warmup_steps);
  const double span = std::max<double>(1.0, double(t.steps - t.warmup_steps));
  const double progress = std::min(1.0, double(step - t.warmup_steps) / span);
  const double lo = t.lr * t.min_lr_ratio;
  return lo + (t.lr - lo) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

AdamW::AdamW(std::vector<Param*> params, const TrainConfig& t, const kernels::Ctx& ctx)
    : ctx_(ctx), params_(std::move(params)), cfg_(t) {
  for (Param* p : params_)
    state_.emplace(p->name, std::make_pair(kernels::zeros(ctx_, p->value.shape()),
                                           kernels::zeros(ctx_, p->value.shape())));
}

void AdamW::step(double lr, float grad_scale) {
  ++t_;
  kernels::AdamWHyper h;
  h.lr = lr;
  h.beta1 = cfg_.beta1;
  h.beta2 = cfg_.beta2;
  h.eps = cfg_.eps;
  h.weight_decay = cfg_.weight_decay;
  for (Param* p : params_) {
    if (p->reduce == GradReduce::none) continue;
    auto& [m, v] = state_.at(p->name);
    kernels::adamw_step(ctx_, p->value.ptr(), p->grad.ptr(), m.ptr(), v.ptr(), p->value.numel(), h,
                        t_, grad_scale, p->decay);
  }
}

}  // namespace trident::train
