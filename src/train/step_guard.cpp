// Helpers of the step guards (see train/step_guard.hpp).
#include "trident/train/step_guard.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "trident/kernels/functional.hpp"
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

// Whether a host tensor's elements are all finite (stops at the first block
// that is not).
bool all_finite_host(const Tensor& t) {
  const float* g = t.ptr();
  const int64_t n = t.numel();
  int64_t k = 0;
  for (; k + kScanBlock <= n; k += kScanBlock)
    if (block_has_nonfinite(g + k)) return false;
  for (; k < n; ++k)
    if (!std::isfinite(g[k])) return false;
  return true;
}

// The gradients grouped by the storage they share (normally one group: the
// ParamStore's allocation): each group's lowest gradient and its members.
struct StorageGroup {
  const Tensor* base = nullptr;
  std::vector<size_t> members;  // indices into params
};
std::vector<StorageGroup> storage_groups(const std::vector<Param*>& params) {
  std::vector<StorageGroup> groups;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& g = params[i]->grad;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const StorageGroup& sg) { return g.shares_storage_with(*sg.base); });
    if (it == groups.end()) it = groups.insert(groups.end(), StorageGroup{&g, {}});
    if (g.ptr() < it->base->ptr()) it->base = &g;
    it->members.push_back(i);
  }
  return groups;
}

// Whether each parameter's gradient is all finite. On a device: the sums of
// squares of every gradient (finite exactly when its elements are), one op
// per storage group into one array of sums, which reaches the host in one
// copy: one wait, whatever the number of parameters.
std::vector<char> finite_flags(const kernels::Ctx& ctx, const std::vector<Param*>& params) {
  std::vector<char> finite(params.size(), 1);
  if (params.empty()) return finite;
  if (params[0]->grad.device().is_cpu()) {
    for (size_t i = 0; i < params.size(); ++i) finite[i] = all_finite_host(params[i]->grad);
    return finite;
  }
  const std::vector<StorageGroup> groups = storage_groups(params);
  std::vector<int64_t> ranges;  // offsets from the group's base, in group order
  std::vector<int64_t> spans;   // per group: the elements from its base to its last range's end
  for (const StorageGroup& sg : groups) {
    int64_t span = 0;
    for (size_t i : sg.members) {
      const Tensor& g = params[i]->grad;
      ranges.push_back(g.ptr() - sg.base->ptr());
      ranges.push_back(ranges.back() + g.numel());
      span = std::max(span, ranges.back());
    }
    spans.push_back(span);
  }
  const int64_t n = int64_t(params.size());
  const Tensor dev_ranges = kernels::from_host(ctx, ranges.data(), {2 * n}, DType::i64);
  Tensor sums = kernels::empty(ctx, {n}, DType::f64);
  int64_t first = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    const int64_t count = int64_t(groups[k].members.size());
    // The group's storage from its base on: its members are views of one
    // allocation that the base handle keeps alive.
    const Tensor& base = *groups[k].base;
    const Tensor x = Tensor::borrow(base.data<float>(), {spans[k]}, base.device());
    kernels::sum_squares_ranges(ctx, x, dev_ranges.view(2 * first, {2 * count}),
                                sums.view(first, {count}));
    first += count;
  }
  const Tensor host = kernels::to_host(ctx, sums);
  int64_t k = 0;
  for (const StorageGroup& sg : groups)
    for (size_t i : sg.members) finite[i] = std::isfinite(host.data<double>()[k++]);
  return finite;
}

// The gradient's elements where the host reads them.
Tensor grad_on_host(const kernels::Ctx& ctx, const Param& p) {
  return p.grad.device().is_cpu() ? p.grad : kernels::to_host(ctx, p.grad);
}

}  // namespace

int first_nonfinite_gradient(const kernels::Ctx& ctx, const std::vector<Param*>& params,
                             int n_layers) {
  int best = -1, best_order = 0;
  const std::vector<char> finite = finite_flags(ctx, params);
  for (size_t i = 0; i < params.size(); ++i) {
    const Param& p = *params[i];
    if (finite[i]) continue;
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
