// Router: top-k weights, the aux loss against its definition, capacity drops,
// gradients against finite differences, and the sigmoid_bias balancing.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "ep_fixtures.hpp"
#include "ep_test_util.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/moe.hpp"
#include "trident/kernels/router.hpp"
#include "trident/parallel/ep/router.hpp"

using namespace trident;
using namespace trident::ep;
using trident::testing::host_flat;
using trident::testing::host_rows;
using trident::testing::randn;

namespace {

// A host tensor of i32 as a vector (routing decisions compared whole).
std::vector<int> ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int>(p, p + t.numel());
}
// Logits with well separated values per row (a shuffled ladder plus noise),
// so a finite-difference step never changes the top-k.
std::vector<float> ladder_logits(int T, int E, const std::string& key) {
  std::vector<float> l(size_t(T) * E);
  auto noise = randn(T * E, key, 0.03f);
  for (int t = 0; t < T; ++t) {
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    for (int e = E - 1; e > 0; --e)
      std::swap(order[e], order[rng::below(rng::hash_name(key), t * 64 + e, e + 1)]);
    for (int e = 0; e < E; ++e) l[t * E + e] = 0.25f * float(order[e]) - 0.8f + noise[t * E + e];
  }
  return l;
}
double objective(const Router& router, const std::vector<float>& logits, int T,
                 const std::vector<int>& sample, int n_samples, const std::vector<float>& a,
                 double daux) {
  Routing r;
  router.route(kernels::Ctx{}, host_flat(logits), sample, n_samples, nullptr, r);
  double j = 0;
  for (size_t i = 0; i < size_t(r.weight.numel()); ++i)
    if (r.expert.data<int32_t>()[i] >= 0) j += double(a[i]) * r.weight.data<float>()[i];
  return j + daux * (r.aux_share + r.z_share);
}
}  // namespace

TEST_CASE("uniform router probabilities give aux loss exactly coef per sample", "[router]") {
  RouterOptions o;
  o.n_experts = 8;
  o.top_k = 2;
  o.aux_loss_coef = 0.01;
  Router router(o);
  const int T = 12;
  std::vector<float> logits(T * 8, 0.0f);  // x·W with W = 0: every p = 1/8
  std::vector<int> sample = {0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1};
  Routing r;
  router.route(kernels::Ctx{}, host_flat(logits), sample, 2, nullptr, r);
  CHECK(r.aux_share == Approx(2 * 0.01).epsilon(1e-14));
}

TEST_CASE("aux loss equals coef*E*sum f_i P_i per sample, z-loss its definition", "[router]") {
  for (auto scoring : {RouterScoring::softmax, RouterScoring::sigmoid_bias}) {
    RouterOptions o;
    o.n_experts = 6;
    o.top_k = 2;
    o.scoring = scoring;
    o.aux_loss_coef = 0.05;
    o.z_loss_coef = 0.002;
    Router router(o);
    const int T = 10, E = 6, k = 2;
    auto logits = randn(T * E, "auxlogits");
    std::vector<int> sample = {1, 0, 1, 0, 0, 1, 1, 1, 0, 1};
    Routing r;
    router.route(kernels::Ctx{}, host_flat(logits), sample, 2, nullptr, r);
    double aux = 0, z = 0;
    for (int s = 0; s < 2; ++s) {
      std::vector<double> f(E, 0), P(E, 0);
      double Ts = 0, zs = 0;
      for (int t = 0; t < T; ++t) {
        if (sample[t] != s) continue;
        Ts += 1;
        std::vector<double> p(E);
        double m = -1e30, zsum = 0, norm = 0;
        for (int e = 0; e < E; ++e) m = std::max(m, double(logits[t * E + e]));
        for (int e = 0; e < E; ++e) zsum += std::exp(logits[t * E + e] - m);
        for (int e = 0; e < E; ++e) {
          p[e] = scoring == RouterScoring::softmax ? std::exp(logits[t * E + e] - m) / zsum
                                                   : 1.0 / (1.0 + std::exp(-logits[t * E + e]));
          norm += p[e];
        }
        // top-k by p (bias is zero), ties impossible with random logits
        std::vector<int> ord(E);
        for (int e = 0; e < E; ++e) ord[e] = e;
        std::sort(ord.begin(), ord.end(), [&](int a, int b) { return p[a] > p[b]; });
        for (int j = 0; j < k; ++j) f[ord[j]] += 1;
        for (int e = 0; e < E; ++e) P[e] += scoring == RouterScoring::softmax ? p[e] : p[e] / norm;
        double lse = m + std::log(zsum);
        zs += 0.002 * lse * lse;
      }
      double fp = 0;
      for (int e = 0; e < E; ++e) fp += (f[e] / (Ts * k)) * (P[e] / Ts);
      aux += 0.05 * E * fp;
      z += zs / Ts;
    }
    CHECK(r.aux_share == Approx(aux).epsilon(1e-6));
    CHECK(r.z_share == Approx(z).epsilon(1e-6));
  }
}

TEST_CASE("softmax top-k weights are renormalised over the chosen k when asked", "[router]") {
  RouterOptions o;
  o.n_experts = 5;
  o.top_k = 3;
  const int T = 4;
  auto logits = randn(T * 5, "norm");
  std::vector<int> sample(T, 0);
  for (bool norm : {true, false}) {
    o.norm_topk = norm;
    Routing r;
    Router(o).route(kernels::Ctx{}, host_flat(logits), sample, 1, nullptr, r);
    for (int t = 0; t < T; ++t) {
      double s = 0;
      for (int j = 0; j < 3; ++j) s += r.weight.data<float>()[t * 3 + j];
      if (norm)
        CHECK(s == Approx(1.0).epsilon(1e-6));
      else
        CHECK(s < 1.0);
      CHECK(r.weight.data<float>()[t * 3] >= r.weight.data<float>()[t * 3 + 1]);
    }
  }
}

TEST_CASE("router gradients match finite differences", "[router]") {
  const int T = 8, E = 6, k = 2;
  std::vector<int> sample = {0, 0, 1, 1, 1, 0, 1, 0};
  auto a = randn(T * k, "dw");
  const double daux = 0.7;
  for (auto scoring : {RouterScoring::softmax, RouterScoring::sigmoid_bias}) {
    for (bool norm : {true, false}) {
      RouterOptions o;
      o.n_experts = E;
      o.top_k = k;
      o.scoring = scoring;
      o.norm_topk = norm;
      o.aux_loss_coef = 0.3;
      o.z_loss_coef = 0.05;
      Router router(o);
      if (scoring == RouterScoring::sigmoid_bias)
        router.bias() = {0.01f, -0.02f, 0.f, 0.03f, 0.f, -0.01f};
      auto logits = ladder_logits(T, E, "fd");
      Routing r;
      router.route(kernels::Ctx{}, host_flat(logits), sample, 2, nullptr, r);
      std::vector<float> dl(T * E);
      router.backward(kernels::Ctx{}, r, host_flat(a), float(daux), host_rows(dl, E));
      const float eps = 2e-3f;
      double worst = 0;
      for (int i = 0; i < T * E; ++i) {
        auto lp = logits, lm = logits;
        lp[i] += eps;
        lm[i] -= eps;
        double num = (objective(router, lp, T, sample, 2, a, daux) -
                      objective(router, lm, T, sample, 2, a, daux)) /
                     (2.0 * eps);
        worst = std::max(worst, std::fabs(num - dl[i]) / std::max(0.05, std::fabs(num)));
      }
      INFO("scoring " << int(scoring) << " norm " << norm);
      CHECK(worst < 2e-3);
    }
  }
}

TEST_CASE("capacity keeps the highest weights per expert and reports drops", "[router]") {
  // 8 tokens, top-1 of 4, cf 1: capacity ceil(1*8*1/4) = 2 per expert.
  RouterOptions o;
  o.n_experts = 4;
  o.top_k = 1;
  o.norm_topk = false;
  o.capacity_factor = 1.0;
  const int T = 8, E = 4;
  std::vector<float> logits(T * E, 0.0f);
  // Tokens 0..4 pick expert 0 with rising confidence; 5, 6, 7 pick 1, 2, 3.
  for (int t = 0; t < 5; ++t) logits[t * E + 0] = 2.0f + 0.1f * t;
  for (int t = 5; t < 8; ++t) logits[t * E + (t - 4)] = 3.0f;
  std::vector<int> sample(T, 0);
  Routing r;
  Router(o).route(kernels::Ctx{}, host_flat(logits), sample, 1, nullptr, r);
  CHECK(r.capacity == 2);
  CHECK(ints(r.expert) == std::vector<int>{-1, -1, -1, 0, 0, 1, 2, 3});
  CHECK(r.dropped == 3);
  // Equal weights (top-1, renormalised: all 1): the lower tokens stay.
  o.norm_topk = true;
  o.capacity_factor = 0.5;  // ceil(0.5*8/4) = 1
  Router(o).route(kernels::Ctx{}, host_flat(logits), sample, 1, nullptr, r);
  CHECK(r.capacity == 1);
  CHECK(ints(r.expert) == std::vector<int>{0, -1, -1, -1, -1, 1, 2, 3});
  CHECK(r.dropped == 4);
  // Dropless: nothing dropped whatever the skew.
  o.capacity_factor = 0.0;
  Router(o).route(kernels::Ctx{}, host_flat(logits), sample, 1, nullptr, r);
  CHECK(r.dropped == 0);
  CHECK(ints(r.expert) == ints(r.chosen));
}

TEST_CASE("sigmoid_bias update moves a skewed router toward balance", "[router]") {
  RouterOptions o;
  o.n_experts = 8;
  o.top_k = 2;
  o.scoring = RouterScoring::sigmoid_bias;
  o.bias_rate = 0.01;
  Router router(o);
  const int T = 256, E = 8;
  // Skewed: experts 0 and 1 get a large head start on every token.
  auto logits = randn(T * E, "skew", 0.5f);
  for (int t = 0; t < T; ++t) {
    logits[t * E + 0] += 2.0f;
    logits[t * E + 1] += 1.5f;
  }
  std::vector<int> sample(T, 0);
  auto imbalance = [&]() {
    Routing r;
    router.route(kernels::Ctx{}, host_flat(logits), sample, 1, nullptr, r);
    std::vector<int64_t> load(E, 0);
    for (int e : ints(r.chosen)) load[e]++;
    int64_t mx = *std::max_element(load.begin(), load.end());
    return std::make_pair(double(mx) / (double(T) * 2 / E), load);
  };
  const double first = imbalance().first;
  for (int step = 0; step < 300; ++step) router.update_bias(imbalance().second);
  const double last = imbalance().first;
  INFO("imbalance " << first << " -> " << last);
  CHECK(first > 3.0);
  CHECK(last < 1.5);
  // The bias never changes the weights: they stay sigmoid scores of the chosen.
  Routing r;
  router.route(kernels::Ctx{}, host_flat(logits), sample, 1, nullptr, r);
  for (int t = 0; t < 4; ++t) {
    double s0 = 1.0 / (1.0 + std::exp(-logits[t * E + r.chosen.data<int32_t>()[t * 2]]));
    double s1 = 1.0 / (1.0 + std::exp(-logits[t * E + r.chosen.data<int32_t>()[t * 2 + 1]]));
    CHECK(r.weight.data<float>()[t * 2] == Approx(s0 / (s0 + s1)).epsilon(1e-5));
  }
}

TEST_CASE("softmax router ignores update_bias; unknown scoring is an InputError", "[router]") {
  RouterOptions o;
  Router router(o);
  router.update_bias({9, 0, 0, 0, 0, 0, 0, 0});
  for (float b : router.bias()) CHECK(b == 0.0f);
  CHECK_THROWS_AS(parse_router_scoring("topk"), InputError);
}

TEST_CASE("the device plan kernels: capacity places, counts and the stable expert order",
          "[router]") {
  // Three ranks' copies with tied weights; the kernel (a sort per expert on
  // the CPU) must keep exactly the copies whose place, counted one by one
  // as the CUDA kernel counts it, is below the capacity.
  const kernels::Ctx ctx{};
  const int E = 6, k = 2, ranks = 3;
  const int64_t T = 40, n = T * k, N = n * ranks;
  auto w = randn(N, "capacity weights");
  std::vector<int> chosen(N);
  std::vector<int64_t> token(T * ranks);
  for (int64_t i = 0; i < N; ++i) {
    chosen[i] = int((i * 5 + i / 3) % E);
    if (i % k == 1 && chosen[i] == chosen[i - 1]) chosen[i] = (chosen[i] + 1) % E;
    if (i % 7 == 0) w[i] = 0.5f;  // ties, broken by token then slot
  }
  for (int64_t t = 0; t < T * ranks; ++t) token[t] = (t * 11) % (T * ranks);
  kernels::RouterDims dims;
  dims.T = T;
  dims.E = E;
  dims.k = k;
  for (int me = 0; me < ranks; ++me) {
    for (int64_t capacity : {int64_t(2), int64_t(9), int64_t(N)}) {
      std::vector<int> expert(n);
      int64_t dropped = -1;
      kernels::router_capacity(ctx, dims, ranks, me, token.data(), w.data(), chosen.data(),
                               capacity, expert.data(), &dropped);
      int64_t want_dropped = 0;
      for (int64_t m = 0; m < n; ++m) {
        const int64_t i = n * me + m;
        int64_t place = 0;
        for (int64_t j = 0; j < N; ++j) {
          if (j == i || chosen[j] != chosen[i]) continue;
          const bool before = w[j] != w[i]                   ? w[j] > w[i]
                              : token[j / k] != token[i / k] ? token[j / k] < token[i / k]
                                                             : j % k < i % k;
          place += before ? 1 : 0;
        }
        const int want = place < capacity ? chosen[i] : -1;
        want_dropped += want < 0 ? 1 : 0;
        REQUIRE(expert[m] == want);
      }
      CHECK(dropped == want_dropped);
      if (capacity == N) CHECK(dropped == 0);
      if (capacity == 2) CHECK(dropped > 0);

      std::vector<int64_t> counts(E);
      kernels::expert_counts(ctx, expert.data(), n, E, counts.data());
      int64_t S = 0;
      for (int e = 0; e < E; ++e) {
        CHECK(counts[e] == std::count(expert.begin(), expert.end(), e));
        S += counts[e];
      }
      std::vector<int64_t> row_of(n), send_token(S);
      kernels::expert_order(ctx, expert.data(), n, k, E, counts.data(), row_of.data(),
                            send_token.data());
      // Rows are expert-major and in copy order within an expert; every
      // kept copy has one row and every row names its copy's token.
      int64_t prev_row = -1;
      std::vector<int> seen(S, 0);
      for (int e = 0; e < E; ++e)
        for (int64_t i = 0; i < n; ++i) {
          if (expert[i] != e) continue;
          REQUIRE(row_of[i] > prev_row);
          prev_row = row_of[i];
          seen[row_of[i]]++;
          CHECK(send_token[row_of[i]] == i / k);
        }
      for (int64_t i = 0; i < n; ++i)
        if (expert[i] < 0) CHECK(row_of[i] == -1);
      CHECK(std::count(seen.begin(), seen.end(), 1) == S);
    }
  }
}

TEST_CASE("router frequencies from the per-sample loads", "[router]") {
  kernels::RouterDims dims;
  dims.E = 3;
  dims.k = 2;
  // sample 0: 4 tokens (copies 3, 4, 1); sample 1: empty
  const std::vector<double> stats{3, 4, 1, 4, 0, 0, 0, 0};
  std::vector<double> f(6, -1), inv(2, -1);
  kernels::router_frequencies(kernels::Ctx{}, dims, stats.data(), 2, f.data(), inv.data());
  CHECK(f == std::vector<double>{3.0 / 8, 4.0 / 8, 1.0 / 8, 0, 0, 0});
  CHECK(inv == std::vector<double>{0.25, 0.0});
}
