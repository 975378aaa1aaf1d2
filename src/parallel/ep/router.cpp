// Router: the routing decisions around the router kernels: statistics
// reduced over the CP group, capacity drops decided over the whole
// micro-batch, and the auxiliary-loss-free bias update.
#include "trident/parallel/ep/router.hpp"

#include <algorithm>
#include <cmath>

#include "trident/core/error.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/tensor_ops.hpp"

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

kernels::RouterDims Router::dims(int64_t T) const {
  kernels::RouterDims d;
  d.T = T;
  d.E = o_.n_experts;
  d.k = o_.top_k;
  d.score = o_.scoring == RouterScoring::sigmoid_bias ? kernels::RouterScore::sigmoid
                                                      : kernels::RouterScore::softmax;
  d.norm_topk = o_.norm_topk;
  return d;
}

void Router::route(const kernels::Ctx& ctx, const float* logits, int64_t T,
                   const std::vector<int>& sample_of_token, int n_samples, Communicator* cp,
                   Routing& r, const int64_t* token_index) const {
  const int E = o_.n_experts, k = o_.top_k;
  const bool sig = o_.scoring == RouterScoring::sigmoid_bias;
  TRIDENT_CHECK(static_cast<int64_t>(sample_of_token.size()) == T,
                "router: sample_of_token has " + std::to_string(sample_of_token.size()) +
                    " entries for " + std::to_string(T) + " tokens");
  for (int s : sample_of_token)
    TRIDENT_CHECK(s >= 0 && s < n_samples, "router: sample id out of range");
  const kernels::RouterDims dm = dims(T);
  r.T = T;
  r.logits = kernels::empty(ctx, {T, E});  // a device copy: the logits never visit the host
  kernels::copy(ctx, r.logits.data<float>(), logits, T * E);
  r.probs.assign(static_cast<size_t>(T * E), 0.0f);
  r.lse.assign(static_cast<size_t>(T), 0.0f);
  r.sample = sample_of_token;
  kernels::router_scores(ctx, dm, logits, r.probs.data(), r.lse.data());
  r.chosen.assign(static_cast<size_t>(T * k), 0);
  r.weight.assign(static_cast<size_t>(T * k), 0.0f);
  kernels::router_topk(ctx, dm, r.probs.data(), sig ? bias_.data() : nullptr, r.chosen.data(),
                       r.weight.data());

  // Per-sample statistics, summed over the CP ranks that share the samples.
  const size_t stride = static_cast<size_t>(E + 1);
  std::vector<double> stats(static_cast<size_t>(n_samples) * stride, 0.0);
  kernels::router_load(ctx, dm, r.chosen.data(), sample_of_token.data(), n_samples, stats.data());
  if (cp && cp->size() > 1) cp->allreduce_sum(stats.data(), stats.size());
  r.f.assign(static_cast<size_t>(n_samples) * E, 0.0);
  r.inv_tokens.assign(static_cast<size_t>(n_samples), 0.0);
  for (int s = 0; s < n_samples; ++s) {
    const double Ts = stats[s * stride + E];
    if (Ts == 0) continue;
    r.inv_tokens[s] = 1.0 / Ts;
    for (int e = 0; e < E; ++e) r.f[s * E + e] = stats[s * stride + e] / (Ts * k);
  }
  kernels::RouterLossTerms terms{sample_of_token.data(), r.f.data(), r.inv_tokens.data(),
                                 o_.aux_loss_coef, o_.z_loss_coef};
  kernels::router_losses(ctx, dm, r.probs.data(), r.lse.data(), terms, &r.aux_share, &r.z_share);
  apply_capacity(r, cp, token_index);
}

void Router::apply_capacity(Routing& r, Communicator* cp, const int64_t* token_index) const {
  const int E = o_.n_experts, k = o_.top_k;
  const int64_t n = r.T * k;
  r.expert = r.chosen;
  r.dropped = 0;
  r.capacity = 0;
  if (o_.capacity_factor <= 0) return;
  // Every copy of the micro-batch, from every rank of the group (in rank
  // order), so that each rank takes the decisions one rank would take.
  struct Copy {
    int64_t token;
    float weight;
    int expert;
  };
  static_assert(sizeof(Copy) == 16, "Copy travels as bytes");
  const bool split = cp && cp->size() > 1;
  const int ranks = split ? cp->size() : 1, me = split ? cp->rank() : 0;
  std::vector<Copy> all(static_cast<size_t>(n * ranks));
  Copy* mine = all.data() + n * me;
  for (int64_t i = 0; i < n; ++i)
    mine[i] = {token_index ? token_index[i / k] : i / k, r.weight[i], r.chosen[i]};
  if (split) {
    std::vector<Copy> own(mine, mine + n);
    cp->allgather(own.data(), all.data(), sizeof(Copy) * size_t(n));
  }
  r.capacity = static_cast<int64_t>(std::ceil(o_.capacity_factor * double(r.T * ranks) * k / E));
  std::vector<std::vector<int64_t>> copies(E);
  for (int64_t i = 0; i < n * ranks; ++i) copies[all[i].expert].push_back(i);
  // Highest weight first; ties: lower token, then lower slot.
  auto before = [&](int64_t a, int64_t b) {
    const Copy &x = all[a], &y = all[b];
    if (x.weight != y.weight) return x.weight > y.weight;
    if (x.token != y.token) return x.token < y.token;
    return a % k < b % k;
  };
  for (auto& c : copies) {
    if (static_cast<int64_t>(c.size()) <= r.capacity) continue;
    std::sort(c.begin(), c.end(), before);
    for (size_t m = static_cast<size_t>(r.capacity); m < c.size(); ++m) {
      if (c[m] / n != me) continue;
      r.expert[c[m] % n] = -1;
      ++r.dropped;
    }
  }
}

void Router::backward(const kernels::Ctx& ctx, const Routing& r, const float* dweight,
                      float daux_scale, float* dlogits) const {
  kernels::RouterSaved saved{r.logits.data<float>(), r.probs.data(), r.lse.data(), r.chosen.data(),
                             r.weight.data()};
  kernels::RouterLossTerms terms{r.sample.data(), r.f.data(), r.inv_tokens.data(), o_.aux_loss_coef,
                                 o_.z_loss_coef};
  kernels::router_backward(ctx, dims(r.T), saved, terms, dweight, daux_scale, dlogits);
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
