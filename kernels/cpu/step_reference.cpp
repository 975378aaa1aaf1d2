// The plain references of step_reference.hpp: the SwiGLU backward, RoPE and
// AdamW as index-order loops in fp64, without the GEMMs of swiglu.cpp, the
// cos/sin table of rope.cpp or the fp32 vector pass of adamw.cpp.
#include "step_reference.hpp"

#include <cmath>
#include <vector>

namespace trident::kernels::cpu::reference {
namespace {

double sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

// The weight gradients over all tokens, in fp64 until they are added to the
// caller's (accumulated) buffers.
struct SwigluGrads {
  std::vector<double> gate, up, down;
  void add_to(float* dw_gate, float* dw_up, float* dw_down) const {
    for (size_t i = 0; i < gate.size(); ++i) {
      dw_gate[i] = float(dw_gate[i] + gate[i]);
      dw_up[i] = float(dw_up[i] + up[i]);
      dw_down[i] = float(dw_down[i] + down[i]);
    }
  }
};

// dh = dy_t W_down [f]; dW_down += dy_tᵀ h.
void down_backward(const float* dyt, const std::vector<double>& h, int64_t d, int64_t f,
                   const float* w_down, std::vector<double>& dh, std::vector<double>& dw_down) {
  for (int64_t k = 0; k < f; ++k) dh[size_t(k)] = 0.0;
  for (int64_t i = 0; i < d; ++i) {
    for (int64_t k = 0; k < f; ++k) {
      dh[size_t(k)] += double(dyt[i]) * w_down[i * f + k];
      dw_down[size_t(i * f + k)] += double(dyt[i]) * h[size_t(k)];
    }
  }
}

}  // namespace

void swiglu_backward(const float* x, const float* gate, const float* up, const float* dy, int64_t T,
                     int64_t d, int64_t f, const float* w_gate, const float* w_up,
                     const float* w_down, float* dx, float* dw_gate, float* dw_up, float* dw_down) {
  const size_t fd = size_t(f * d);
  SwigluGrads w{std::vector<double>(fd), std::vector<double>(fd), std::vector<double>(fd)};
  const size_t nf = size_t(f);
  std::vector<double> h(nf), dh(nf), dg(nf), du(nf);
  for (int64_t t = 0; t < T; ++t) {
    const float *xt = x + t * d, *gt = gate + t * f, *ut = up + t * f;
    for (int64_t k = 0; k < f; ++k) h[size_t(k)] = gt[k] * sigmoid(gt[k]) * ut[k];
    down_backward(dy + t * d, h, d, f, w_down, dh, w.down);
    for (int64_t k = 0; k < f; ++k) {
      const double a = gt[k], s = sigmoid(a);
      dg[size_t(k)] = dh[size_t(k)] * ut[k] * s * (1.0 + a * (1.0 - s));
      du[size_t(k)] = dh[size_t(k)] * a * s;
      for (int64_t i = 0; i < d; ++i) {
        w.gate[size_t(k * d + i)] += dg[size_t(k)] * xt[i];
        w.up[size_t(k * d + i)] += du[size_t(k)] * xt[i];
      }
    }
    for (int64_t i = 0; dx && i < d; ++i) {
      double s = 0.0;
      for (int64_t k = 0; k < f; ++k)
        s += dg[size_t(k)] * w_gate[k * d + i] + du[size_t(k)] * w_up[k * d + i];
      dx[t * d + i] = float(s);
    }
  }
  w.add_to(dw_gate, dw_up, dw_down);
}

namespace {

// Turns every head's pairs (i, i + D/2) of token t by sign * pos * inv_freq(i).
void rotate(float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D, const RopeFreqs& freqs,
            double sign) {
  const int64_t half = D / 2;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t hd = 0; hd < H; ++hd) {
      float* v = x + (t * H + hd) * D;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = sign * double(pos[t]) * rope_inv_freq(freqs, i, D);
        const double c = std::cos(angle), s = std::sin(angle), a = v[i], b = v[i + half];
        v[i] = float(a * c - b * s);
        v[i + half] = float(a * s + b * c);
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                  const RopeFreqs& freqs) {
  rotate(x, pos, T, H, D, freqs, 1.0);
}

void rope_backward(float* dx, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                   const RopeFreqs& freqs) {
  rotate(dx, pos, T, H, D, freqs, -1.0);
}

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, const AdamWHyper& h,
                int64_t step, float grad_scale, bool decay) {
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  for (int64_t i = 0; i < n; ++i) {
    const double gi = double(g[i]) * grad_scale;
    const double mi = h.beta1 * m[i] + (1.0 - h.beta1) * gi;
    const double vi = h.beta2 * v[i] + (1.0 - h.beta2) * gi * gi;
    const double update = mi / bc1 / (std::sqrt(vi / bc2) + h.eps);
    const double wd = decay ? h.weight_decay * p[i] : 0.0;
    p[i] = float(p[i] - h.lr * (wd + update));
    m[i] = float(mi);
    v[i] = float(vi);
  }
}

}  // namespace trident::kernels::cpu::reference
