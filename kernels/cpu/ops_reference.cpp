// The plain references of the CPU's small tuned ops (reference.hpp): RMSNorm,
// cross-entropy and the SwiGLU forward as index-order loops in fp64, without
// the fixed-order vector lanes, the vector expf or the GEMMs of rmsnorm.cpp,
// cross_entropy.cpp and swiglu.cpp (ctest test_reference compares them).
#include <cmath>
#include <vector>

#include "reference.hpp"

namespace trident::kernels::cpu::reference {

void rmsnorm_forward(const float* x, const float* w, int64_t T, int64_t d, float eps, float* y,
                     float* rstd) {
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += double(x[t * d + i]) * x[t * d + i];
    const double r = 1.0 / std::sqrt(ss / double(d) + double(eps));
    rstd[t] = float(r);
    for (int64_t i = 0; i < d; ++i) y[t * d + i] = float(x[t * d + i] * r * w[i]);
  }
}

// With xhat = x r and g = dy w: dx = r (g - xhat mean(g xhat)), dw += dy xhat.
void rmsnorm_backward(const float* dy, const float* x, const float* w, const float* rstd, int64_t T,
                      int64_t d, float* dx, float* dw) {
  for (int64_t t = 0; t < T; ++t) {
    const double r = rstd[t];
    double mean = 0.0;
    for (int64_t i = 0; i < d; ++i) mean += double(dy[t * d + i]) * w[i] * x[t * d + i] * r;
    mean /= double(d);
    for (int64_t i = 0; i < d; ++i) {
      const double xhat = x[t * d + i] * r;
      dx[t * d + i] = float(r * (double(dy[t * d + i]) * w[i] - xhat * mean));
      if (dw) dw[i] = float(dw[i] + dy[t * d + i] * xhat);
    }
  }
}

double cross_entropy(const float* logits, const int32_t* targets, int64_t T, int64_t V, float scale,
                     float* dlogits) {
  double loss = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * V;
    float* dz = dlogits ? dlogits + t * V : nullptr;
    if (targets[t] < 0) {
      for (int64_t j = 0; dz && j < V; ++j) dz[j] = 0.0f;
      continue;
    }
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(z[j]));
    for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - mx);
    loss += mx + std::log(sum) - z[targets[t]];
    for (int64_t j = 0; dz && j < V; ++j)
      dz[j] = float(scale * (std::exp(z[j] - mx) / sum - (j == targets[t] ? 1.0 : 0.0)));
  }
  return loss;
}

void swiglu_forward(const float* x, int64_t T, int64_t d, int64_t f, const float* w_gate,
                    const float* w_up, const float* w_down, float* y, float* gate, float* up) {
  std::vector<double> h(static_cast<size_t>(f), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * d;
    for (int64_t k = 0; k < f; ++k) {
      double a = 0.0, b = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        a += double(xt[i]) * w_gate[k * d + i];
        b += double(xt[i]) * w_up[k * d + i];
      }
      gate[t * f + k] = float(a);
      up[t * f + k] = float(b);
      h[size_t(k)] = a / (1.0 + std::exp(-a)) * b;
    }
    for (int64_t i = 0; i < d; ++i) {
      double s = 0.0;
      for (int64_t k = 0; k < f; ++k) s += h[size_t(k)] * w_down[i * f + k];
      y[t * d + i] = float(s);
    }
  }
}

}  // namespace trident::kernels::cpu::reference
