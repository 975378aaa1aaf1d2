// The plain reference of the CPU attention (reference.hpp): for each query
// row and head, the whole score row, its softmax and its gradient in fp64.
#include <cmath>
#include <vector>

#include "reference.hpp"

namespace trident::kernels::cpu::reference {
namespace {

// Where row i's head h starts in q/out, and where key j's kv head g starts.
struct Index {
  const AttnShape& s;
  int64_t q(int64_t i, int h) const { return (i * s.H + h) * s.D; }
  int64_t kv(int64_t j, int g) const { return (j * s.Hkv + g) * s.D; }
};

bool visible(const AttnShape& s, int64_t i, int64_t j) {
  return attn_pair_visible(s, s.q_pos0 + i, s.k_pos0 + j, s.documents() ? s.q_doc[i] : 0,
                           s.documents() ? s.k_doc[j] : 0);
}

// p [Tk] <- softmax over the visible keys of row i, head h (0 elsewhere);
// returns the row's LSE, -inf when no key is visible (p all 0).
double softmax_row(const AttnShape& s, const float* q, const float* k, int64_t i, int h,
                   std::vector<double>& p) {
  const Index at{s};
  const int g = h / (s.H / s.Hkv);
  double mx = -INFINITY;
  for (int64_t j = 0; j < s.Tk; ++j) {
    p[size_t(j)] = -INFINITY;
    if (!visible(s, i, j)) continue;
    double dot = 0.0;
    for (int64_t d = 0; d < s.D; ++d) dot += double(q[at.q(i, h) + d]) * k[at.kv(j, g) + d];
    p[size_t(j)] = dot * s.scale;
    mx = std::max(mx, p[size_t(j)]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < s.Tk; ++j) {
    p[size_t(j)] = mx == -INFINITY || p[size_t(j)] == -INFINITY ? 0.0 : std::exp(p[size_t(j)] - mx);
    sum += p[size_t(j)];
  }
  if (mx == -INFINITY) return -INFINITY;
  for (double& x : p) x /= sum;
  return mx + std::log(sum);
}

// Adds the gradients of row i, head h, given its probabilities p, to the
// fp64 sums g (dq, dk, dv in the layouts of q and k).
struct Grads {
  std::vector<double> dq, dk, dv;
};
void backward_row(const AttnShape& s, const float* q, const float* k, const float* v,
                  const float* dout, int64_t i, int h, const std::vector<double>& p, Grads& sums) {
  const Index at{s};
  const int g = h / (s.H / s.Hkv);
  const float* dO = dout + at.q(i, h);
  std::vector<double> dp(size_t(s.Tk), 0.0);
  double delta = 0.0;  // sum_j p_j dp_j
  for (int64_t j = 0; j < s.Tk; ++j) {
    if (p[size_t(j)] == 0.0) continue;
    for (int64_t d = 0; d < s.D; ++d) dp[size_t(j)] += double(dO[d]) * v[at.kv(j, g) + d];
    delta += p[size_t(j)] * dp[size_t(j)];
  }
  for (int64_t j = 0; j < s.Tk; ++j) {
    if (p[size_t(j)] == 0.0) continue;
    const double ds = p[size_t(j)] * (dp[size_t(j)] - delta) * s.scale;
    for (int64_t d = 0; d < s.D; ++d) {
      sums.dv[size_t(at.kv(j, g) + d)] += p[size_t(j)] * dO[d];
      sums.dk[size_t(at.kv(j, g) + d)] += ds * q[at.q(i, h) + d];
      sums.dq[size_t(at.q(i, h) + d)] += ds * k[at.kv(j, g) + d];
    }
  }
}

void add_to(const std::vector<double>& sum, float* x) {
  for (size_t e = 0; e < sum.size(); ++e) x[e] = float(x[e] + sum[e]);
}

}  // namespace

void attention_forward(const AttnShape& s, const float* q, const float* k, const float* v,
                       float* out, float* lse) {
  check_attn_shape(s);
  const Index at{s};
  std::vector<double> p(size_t(s.Tk)), row(size_t(s.D));
  for (int h = 0; h < s.H; ++h)
    for (int64_t i = 0; i < s.Tq; ++i) {
      const int g = h / (s.H / s.Hkv);
      lse[i * s.H + h] = float(softmax_row(s, q, k, i, h, p));
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t j = 0; j < s.Tk; ++j)
        for (int64_t d = 0; p[size_t(j)] != 0.0 && d < s.D; ++d)
          row[size_t(d)] += p[size_t(j)] * v[at.kv(j, g) + d];
      for (int64_t d = 0; d < s.D; ++d) out[at.q(i, h) + d] = float(row[size_t(d)]);
    }
}

void attention_backward(const AttnShape& s, const float* q, const float* k, const float* v,
                        const float* dout, float* dq, float* dk, float* dv) {
  check_attn_shape(s);
  std::vector<double> p(size_t(s.Tk));
  const size_t nq = size_t(s.Tq * s.H * s.D), nk = size_t(s.Tk * s.Hkv * s.D);
  Grads g{std::vector<double>(nq), std::vector<double>(nk), std::vector<double>(nk)};
  for (int h = 0; h < s.H; ++h)
    for (int64_t i = 0; i < s.Tq; ++i) {
      softmax_row(s, q, k, i, h, p);
      backward_row(s, q, k, v, dout, i, h, p, g);
    }
  add_to(g.dq, dq);
  add_to(g.dk, dk);
  add_to(g.dv, dv);
}

}  // namespace trident::kernels::cpu::reference
