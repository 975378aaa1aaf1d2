// Router: scoring, top-k, capacity drops, the Switch aux loss and z-loss,
// their gradients, and the auxiliary-loss-free bias update.
#include "trident/parallel/ep/router.hpp"

#include <algorithm>
#include <cmath>

#include "trident/core/error.hpp"
#include "trident/kernels/moe.hpp"

namespace trident::ep {

RouterScoring parse_router_scoring(const std::string& name) {
  if (auto scoring = parse_config_name<RouterScoring>(name)) return *scoring;
  throw InputError("model.router: \"" + name + "\" is not one of \"softmax\", \"sigmoid_bias\"");
}

Router::Router(const RouterOptions& o) : o_(o) {
  TRIDENT_CHECK(o.n_experts > 0 && o.top_k >= 1 && o.top_k <= o.n_experts,
                "router: need 1 <= top_k <= n_experts");
  bias_.assign(o.n_experts, 0.0f);
}

void Router::route(const float* logits, int64_t T, const std::vector<int>& sample_of_token,
                   int n_samples, Communicator* cp, Routing& r) const {
  const int E = o_.n_experts, k = o_.top_k;
  const bool sig = o_.scoring == RouterScoring::sigmoid_bias;
  TRIDENT_CHECK(static_cast<int64_t>(sample_of_token.size()) == T,
                "router: sample_of_token has " + std::to_string(sample_of_token.size()) +
                    " entries for " + std::to_string(T) + " tokens");
  r.T = T;
  r.logits.assign(logits, logits + T * E);
  r.probs.assign(static_cast<size_t>(T * E), 0.0f);
  r.lse.assign(static_cast<size_t>(T), 0.0f);
  r.sample = sample_of_token;
  std::vector<float> select(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    float* p = r.probs.data() + t * E;
    float m = l[0];
    for (int e = 1; e < E; ++e) m = std::max(m, l[e]);
    double z = 0;
    for (int e = 0; e < E; ++e) z += std::exp(double(l[e]) - m);
    r.lse[t] = static_cast<float>(m + std::log(z));
    for (int e = 0; e < E; ++e) {
      p[e] = sig ? 1.0f / (1.0f + std::exp(-l[e])) : std::exp(l[e] - r.lse[t]);
      select[t * E + e] = sig ? p[e] + bias_[e] : p[e];
    }
  }
  r.chosen.assign(static_cast<size_t>(T * k), 0);
  kernels::topk_rows(select.data(), T, E, k, r.chosen.data());
  r.weight.assign(static_cast<size_t>(T * k), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += r.probs[t * E + r.chosen[t * k + j]];
    for (int j = 0; j < k; ++j) {
      const float p = r.probs[t * E + r.chosen[t * k + j]];
      r.weight[t * k + j] = o_.norm_topk ? p / sum : p;
    }
  }

  // Per-sample statistics, summed over the CP ranks that share the samples.
  const size_t stride = static_cast<size_t>(E + 1);
  std::vector<double> stats(static_cast<size_t>(n_samples) * stride, 0.0);
  for (int64_t t = 0; t < T; ++t) {
    const int s = sample_of_token[t];
    TRIDENT_CHECK(s >= 0 && s < n_samples, "router: sample id out of range");
    for (int j = 0; j < k; ++j) stats[s * stride + r.chosen[t * k + j]] += 1.0;
    stats[s * stride + E] += 1.0;
  }
  if (cp && cp->size() > 1) cp->allreduce_sum(stats.data(), stats.size());
  r.f.assign(static_cast<size_t>(n_samples) * E, 0.0);
  r.inv_tokens.assign(static_cast<size_t>(n_samples), 0.0);
  for (int s = 0; s < n_samples; ++s) {
    const double Ts = stats[s * stride + E];
    if (Ts == 0) continue;
    r.inv_tokens[s] = 1.0 / Ts;
    for (int e = 0; e < E; ++e) r.f[s * E + e] = stats[s * stride + e] / (Ts * k);
  }
  r.aux_share = 0;
  r.z_share = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int s = sample_of_token[t];
    const float* p = r.probs.data() + t * E;
    double norm = 1.0;
    if (sig) {
      norm = 0;
      for (int e = 0; e < E; ++e) norm += p[e];
    }
    double fp = 0;
    for (int e = 0; e < E; ++e) fp += r.f[s * E + e] * (p[e] / norm);
    r.aux_share += o_.aux_loss_coef * E * fp * r.inv_tokens[s];
    r.z_share += o_.z_loss_coef * double(r.lse[t]) * r.lse[t] * r.inv_tokens[s];
  }

  // Capacity: per expert, the highest weights stay.
  r.expert = r.chosen;
  r.dropped = 0;
  r.capacity = 0;
  if (o_.capacity_factor > 0) {
    r.capacity = static_cast<int64_t>(std::ceil(o_.capacity_factor * double(T) * k / E));
    std::vector<std::vector<int64_t>> copies(E);
    for (int64_t i = 0; i < T * k; ++i) copies[r.chosen[i]].push_back(i);
    for (int e = 0; e < E; ++e) {
      auto& c = copies[e];
      if (static_cast<int64_t>(c.size()) <= r.capacity) continue;
      std::stable_sort(c.begin(), c.end(),
                       [&](int64_t a, int64_t b) { return r.weight[a] > r.weight[b]; });
      for (size_t m = static_cast<size_t>(r.capacity); m < c.size(); ++m) r.expert[c[m]] = -1;
      r.dropped += static_cast<int64_t>(c.size()) - r.capacity;
    }
  }
}

void Router::backward(const Routing& r, const float* dweight, float daux_scale,
                      float* dlogits) const {
  const int E = o_.n_experts, k = o_.top_k;
  const bool sig = o_.scoring == RouterScoring::sigmoid_bias;
  std::vector<double> dp(E);
  for (int64_t t = 0; t < r.T; ++t) {
    const float* p = r.probs.data() + t * E;
    const int* c = r.chosen.data() + t * k;
    const float* w = r.weight.data() + t * k;
    const float* dw = dweight + t * k;
    const int s = r.sample[t];
    std::fill(dp.begin(), dp.end(), 0.0);
    // Through the weights: w_j = p_cj / S (norm_topk) or p_cj.
    if (o_.norm_topk) {
      double S = 0, dot = 0;
      for (int j = 0; j < k; ++j) {
        S += p[c[j]];
        dot += double(dw[j]) * w[j];
      }
      for (int j = 0; j < k; ++j) dp[c[j]] += (dw[j] - dot) / S;
    } else {
      for (int j = 0; j < k; ++j) dp[c[j]] += dw[j];
    }
    // Through the aux loss: dL/dP_i = coef * E * f_i, P_i = mean of q_i.
    const double aux = double(daux_scale) * o_.aux_loss_coef * E * r.inv_tokens[s];
    float* dl = dlogits + t * E;
    if (!sig) {
      for (int e = 0; e < E; ++e) dp[e] += aux * r.f[s * E + e];
      double dot = 0;
      for (int e = 0; e < E; ++e) dot += dp[e] * p[e];
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (dp[e] - dot));
    } else {
      double norm = 0, dq_dot_q = 0;
      for (int e = 0; e < E; ++e) norm += p[e];
      for (int e = 0; e < E; ++e) dq_dot_q += aux * r.f[s * E + e] * (p[e] / norm);
      for (int e = 0; e < E; ++e) dp[e] += (aux * r.f[s * E + e] - dq_dot_q) / norm;
      for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(dp[e] * p[e] * (1.0 - p[e]));
    }
    // z-loss: d(lse^2)/dl_e = 2 * lse * softmax_e.
    if (o_.z_loss_coef != 0) {
      const double zs = double(daux_scale) * o_.z_loss_coef * 2.0 * r.lse[t] * r.inv_tokens[s];
      const float* l = r.logits.data() + t * E;
      for (int e = 0; e < E; ++e) dl[e] += static_cast<float>(zs * std::exp(double(l[e]) - r.lse[t]));
    }
  }
}

void Router::update_bias(const std::vector<int64_t>& load) {
  if (o_.scoring != RouterScoring::sigmoid_bias) return;
  TRIDENT_CHECK(static_cast<int>(load.size()) == o_.n_experts, "update_bias: load needs E entries");
  double mean = 0;
  for (auto v : load) mean += double(v);
  mean /= o_.n_experts;
  for (int e = 0; e < o_.n_experts; ++e) {
    const double diff = mean - double(load[e]);
    const float sign = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f);
    bias_[e] += static_cast<float>(o_.bias_rate) * sign;
  }
}

}  // namespace trident::ep
