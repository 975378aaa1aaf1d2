// Router kernels on the CPU: scores, top-k, loads, the aux and z losses and
// their gradient (definitions in router.hpp), each a loop over tokens of the
// per-token arithmetic the CUDA kernels share (router_token.hpp).
#include <algorithm>
#include <vector>

#include "trident/kernels/moe_backends.hpp"
#include "trident/kernels/router_token.hpp"

namespace trident::kernels::cpu {

void router_scores(const Ctx&, const RouterDims& dims, const float* logits, float* probs,
                   float* lse) {
  const bool sig = dims.score == RouterScore::sigmoid;
  for (int64_t t = 0; t < dims.T; ++t)
    lse[t] = router_token::scores(logits + t * dims.E, dims.E, sig, probs + t * dims.E);
}

void topk_rows(const Ctx&, const float* scores, const float* bias, int64_t T, int E, int k,
               int* idx) {
  for (int64_t t = 0; t < T; ++t) router_token::topk(scores + t * E, bias, E, k, idx + t * k);
}

void router_topk(const Ctx&, const RouterDims& dims, const float* probs, const float* bias,
                 int* chosen, float* weight) {
  const int E = dims.E, k = dims.k;
  for (int64_t t = 0; t < dims.T; ++t)
    router_token::choose(dims, probs + t * E, bias, chosen + t * k, weight + t * k);
}

void router_load(const Ctx&, const RouterDims& dims, const int* chosen, const int* sample,
                 int n_samples, double* stats) {
  const int E = dims.E, k = dims.k;
  const size_t stride = size_t(E) + 1;
  std::fill(stats, stats + size_t(n_samples) * stride, 0.0);
  for (int64_t t = 0; t < dims.T; ++t) {
    double* st = stats + size_t(sample[t]) * stride;
    for (int j = 0; j < k; ++j) st[chosen[t * k + j]] += 1.0;
    st[E] += 1.0;
  }
}

void router_frequencies(const Ctx&, const RouterDims& dims, const double* stats, int n_samples,
                        double* f, double* inv_tokens) {
  const int E = dims.E;
  const size_t stride = size_t(E) + 1;
  for (int s = 0; s < n_samples; ++s) {
    const double Ts = stats[size_t(s) * stride + size_t(E)];
    inv_tokens[s] = Ts == 0 ? 0.0 : 1.0 / Ts;
    for (int e = 0; e < E; ++e)
      f[size_t(s) * E + e] = Ts == 0 ? 0.0 : stats[size_t(s) * stride + size_t(e)] / (Ts * dims.k);
  }
}

void router_capacity(const Ctx&, const RouterDims& dims, int ranks, int me, const int64_t* token,
                     const float* weight, const int* chosen, int64_t capacity, int* expert,
                     int64_t* dropped) {
  const int k = dims.k;
  const int64_t n = dims.T * k, N = n * ranks;
  std::copy(chosen + n * me, chosen + n * (me + 1), expert);
  *dropped = 0;
  std::vector<std::vector<int64_t>> copies(size_t(dims.E));
  for (int64_t i = 0; i < N; ++i) copies[size_t(chosen[i])].push_back(i);
  auto before = [&](int64_t a, int64_t b) {
    if (weight[a] != weight[b]) return weight[a] > weight[b];
    if (token[a / k] != token[b / k]) return token[a / k] < token[b / k];
    return a % k < b % k;
  };
  for (auto& c : copies) {
    if (int64_t(c.size()) <= capacity) continue;
    std::sort(c.begin(), c.end(), before);
    for (size_t m = size_t(capacity); m < c.size(); ++m) {
      if (c[m] / n != me) continue;
      expert[c[m] % n] = -1;
      ++*dropped;
    }
  }
}

void router_losses(const Ctx&, const RouterDims& dims, const float* probs, const float* lse,
                   const RouterLossTerms& terms, double* aux_share, double* z_share) {
  double aux = 0, z = 0;
  for (int64_t t = 0; t < dims.T; ++t) {
    double a = 0, b = 0;
    router_token::loss_terms(dims, probs, lse, terms, t, &a, &b);
    aux += a;
    z += b;
  }
  *aux_share = aux;
  *z_share = z;
}

void router_backward(const Ctx&, const RouterDims& dims, const RouterSaved& saved,
                     const RouterLossTerms& terms, const float* dweight, float daux_scale,
                     float* dlogits) {
  std::vector<double> dp(static_cast<size_t>(dims.E));
  for (int64_t t = 0; t < dims.T; ++t)
    router_token::backward(dims, saved, terms, dweight, daux_scale, t, dp.data(), dlogits);
}

}  // namespace trident::kernels::cpu
