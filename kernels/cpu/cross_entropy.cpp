// Softmax cross-entropy fused with its gradient: the loss needs the softmax
// anyway, so the backward costs one more pass over the row.
#include <algorithm>
#include <cmath>

#include "trident/kernels/backends.hpp"

namespace trident::kernels::cpu {

double cross_entropy(const Ctx& ctx, const float* logits, const int32_t* targets, int64_t T,
                     int64_t V, float scale, float* dlogits) {
  double total = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * V;
    float* dz = dlogits ? dlogits + t * V : nullptr;
    if (targets[t] < 0) {
      if (dz)
        for (int64_t j = 0; j < V; ++j) dz[j] = 0.0f;
      continue;
    }
    float mx = z[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, z[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(z[j] - mx));
    const double lse = double(mx) + std::log(sum);
    total += lse - double(z[targets[t]]);
    if (dz) {
      for (int64_t j = 0; j < V; ++j) dz[j] = scale * static_cast<float>(std::exp(double(z[j]) - lse));
      dz[targets[t]] -= scale;
    }
  }
  return total;
}

}  // namespace trident::kernels::cpu
