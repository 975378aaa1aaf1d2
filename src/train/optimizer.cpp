// AdamW state and the warmup + cosine learning rate.
#include "trident/train/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "trident/core/allocator.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
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
    : ctx_(ctx), cfg_(t) {
  int64_t n = 0;
  for (Param* p : params) {
    pieces_.push_back(Piece{p, 0, p->value.numel(), n});
    n += p->value.numel();
  }
  MemKindScope kind(MemKind::optimizer);
  m_ = kernels::zeros(ctx_, {n});
  v_ = kernels::zeros(ctx_, {n});
}

AdamW::AdamW(const ParamStore& store, const std::array<ParamStore::Range, 3>& owned,
             const std::array<int64_t, 3>& base, int64_t n_moments, const TrainConfig& t,
             const kernels::Ctx& ctx, const std::array<int64_t, 3>& cut)
    : ctx_(ctx), cfg_(t) {
  for (const ParamStore::Entry& e : store.entries()) {
    const size_t k = size_t(e.param->reduce);
    const int64_t hi = std::min(e.offset + e.numel, owned[k].end);
    const int64_t start = store.range(e.param->reduce).begin;
    for (int64_t lo = std::max(e.offset, owned[k].begin); lo < hi;) {
      const int64_t end =
          cut[k] > 0 ? std::min(hi, start + ((lo - start) / cut[k] + 1) * cut[k]) : hi;
      pieces_.push_back(Piece{e.param, lo - e.offset, end - lo, base[k] + lo - owned[k].begin});
      lo = end;
    }
  }
  MemKindScope kind(MemKind::optimizer);
  m_ = kernels::zeros(ctx_, {n_moments});
  v_ = kernels::zeros(ctx_, {n_moments});
}

Tensor AdamW::whole(const Tensor& buf, const std::string& name) const {
  for (const Piece& p : pieces_)
    if (p.param->name == name) {
      TRIDENT_CHECK(p.begin == 0 && p.numel == p.param->value.numel(),
                    "AdamW: this rank holds only part of the moments of " + name);
      return buf.view(p.moment, p.param->value.shape());
    }
  throw Error("AdamW: no parameter " + name);
}

void AdamW::step(double lr, float grad_scale) {
  ++t_;
  kernels::AdamWHyper h;
  h.lr = lr;
  h.beta1 = cfg_.beta1;
  h.beta2 = cfg_.beta2;
  h.eps = cfg_.eps;
  h.weight_decay = cfg_.weight_decay;
  for (const Piece& p : pieces_) {
    if (p.param->reduce == GradReduce::none) continue;
    kernels::adamw_step(ctx_, p.param->value.view(p.begin, {p.numel}),
                        p.param->grad.view(p.begin, {p.numel}), m_.view(p.moment, {p.numel}),
                        v_.view(p.moment, {p.numel}), h, t_, grad_scale, p.param->decay);
  }
}

}  // namespace trident::train
