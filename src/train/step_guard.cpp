// Helpers of the step guards (see train/step_guard.hpp).
#include "trident/train/step_guard.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "trident/kernels/ops.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::train {

int model_order_of(const std::string& name, int n_layers) {
  static const std::string kLayers = "layers.";
  if (name.rfind(kLayers, 0) == 0) {
    const size_t end = name.find('.', kLayers.size());
    try {
      return std::stoi(name.substr(kLayers.size(), end - kLayers.size()));
    } catch (const std::exception&) {
      return n_layers;
    }
  }
  return name.rfind("embed", 0) == 0 ? -1 : n_layers;
}

std::string describe_param(const std::string& name, int n_layers) {
  const int order = model_order_of(name, n_layers);
  if (order < 0) return name + " (before layer 0)";
  if (order >= n_layers) return name + " (after the last layer)";
  return name + " (layer " + std::to_string(order) + ")";
}

namespace {

// Whether any of kBlock floats has an all-ones exponent (inf or NaN). A
// fixed trip count and no early exit let the compiler vectorise it; the
// caller stops at the first such block.
constexpr int64_t kScanBlock = 2048;
bool block_has_nonfinite(const float* g) {
  uint32_t bad = 0;
  for (int64_t k = 0; k < kScanBlock; ++k) {
    uint32_t bits;
    std::memcpy(&bits, g + k, sizeof bits);
    bad |= (~bits & 0x7f800000u) ? 0u : 1u;
  }
  return bad != 0;
}

bool all_finite(const kernels::Ctx& ctx, const Tensor& t) {
  const float* g = t.ptr();
  const int64_t n = t.numel();
  if (!t.device().is_cpu()) return std::isfinite(kernels::sum_squares(ctx, g, n));
  int64_t k = 0;
  for (; k + kScanBlock <= n; k += kScanBlock)
    if (block_has_nonfinite(g + k)) return false;
  for (; k < n; ++k)
    if (!std::isfinite(g[k])) return false;
  return true;
}

// The gradient's elements where the host reads them.
Tensor grad_on_host(const kernels::Ctx& ctx, const Param& p) {
  return p.grad.device().is_cpu() ? p.grad : kernels::to_host(ctx, p.grad);
}

}  // namespace

int first_nonfinite_gradient(const kernels::Ctx& ctx, const std::vector<Param*>& params,
                             int n_layers) {
  int best = -1, best_order = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = *params[i];
    const bool finite = all_finite(ctx, p.grad);
    if (finite) continue;
    const int order = model_order_of(p.name, n_layers);
    if (best < 0 || order < best_order) {
      best = int(i);
      best_order = order;
    }
  }
  return best;
}

int64_t nonfinite_key(int order, int rank, int world_size) {
  return (int64_t(order) + 1) * world_size + rank;
}

int rank_of_key(int64_t key, int world_size) { return int(key % world_size); }

double LossSpikeDetector::add(double loss) {
  if (factor_ <= 0 || !std::isfinite(loss)) return 0;
  double spike_of = 0;
  if (recent_.size() >= min_steps_) {
    std::vector<double> v(recent_.begin(), recent_.end());
    std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
    const double median = v[v.size() / 2];
    if (loss > factor_ * median) spike_of = median;
  }
  recent_.push_back(loss);
  if (recent_.size() > window_) recent_.pop_front();
  return spike_of;
}

void StepSnapshot::take(const kernels::Ctx& ctx, const std::vector<Param*>& params,
                        const std::vector<double>& sums) {
  grads_.clear();
  for (const Param* p : params) {
    const Tensor g = grad_on_host(ctx, *p);
    grads_.insert(grads_.end(), g.ptr(), g.ptr() + g.numel());
  }
  sums_ = sums;
}

bool StepSnapshot::same_bits(const kernels::Ctx& ctx, const std::vector<Param*>& params,
                             const std::vector<double>& sums) const {
  if (sums.size() != sums_.size() ||
      std::memcmp(sums.data(), sums_.data(), sums.size() * sizeof(double)) != 0)
    return false;
  size_t off = 0;
  for (const Param* p : params) {
    const size_t n = size_t(p->grad.numel());
    if (off + n > grads_.size() ||
        std::memcmp(grad_on_host(ctx, *p).ptr(), grads_.data() + off, n * sizeof(float)) != 0)
      return false;
    off += n;
  }
  return off == grads_.size();
}

}  // namespace trident::train
