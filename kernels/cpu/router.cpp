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
