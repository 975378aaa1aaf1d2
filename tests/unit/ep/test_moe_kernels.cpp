// The MoE and router kernels through the public op interface (so that every
// backend meets the same checks): router scores, top-k with a bias, loads
// and losses against plain double-precision definitions, and the unpermute
// reading rows from segments equal to reading them from one buffer.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "ep_test_util.hpp"
#include "trident/kernels/moe.hpp"
#include "trident/kernels/router.hpp"

using namespace trident;
using trident::testing::randn;

namespace {
const kernels::Ctx kCpu{};
}  // namespace

TEST_CASE("router_scores: softmax and sigmoid with logsumexp, against double", "[router]") {
  const int64_t T = 7;
  const int E = 6;
  auto logits = randn(T * E, "rk_logits", 2.0f);
  for (auto score : {kernels::RouterScore::softmax, kernels::RouterScore::sigmoid}) {
    kernels::RouterDims dims{T, E, 2, score, true};
    std::vector<float> p(T * E), lse(T);
    kernels::router_scores(kCpu, dims, logits.data(), p.data(), lse.data());
    for (int64_t t = 0; t < T; ++t) {
      double z = 0;
      for (int e = 0; e < E; ++e) z += std::exp(double(logits[t * E + e]));
      CHECK(lse[t] == Approx(std::log(z)).epsilon(1e-6));
      for (int e = 0; e < E; ++e) {
        const double l = logits[t * E + e];
        const double want =
            score == kernels::RouterScore::softmax ? std::exp(l) / z : 1.0 / (1.0 + std::exp(-l));
        CHECK(p[t * E + e] == Approx(want).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("router_topk: the bias selects, the weights stay the probabilities", "[router]") {
  const int64_t T = 3;
  const int E = 4, k = 2;
  std::vector<float> p = {0.40f, 0.30f, 0.20f, 0.10f,  //
                          0.10f, 0.20f, 0.30f, 0.40f,  //
                          0.25f, 0.25f, 0.25f, 0.25f};
  std::vector<float> bias = {0.0f, 0.0f, 0.15f, 0.0f};
  for (bool norm : {true, false}) {
    kernels::RouterDims dims{T, E, k, kernels::RouterScore::sigmoid, norm};
    std::vector<int> chosen(T * k);
    std::vector<float> w(T * k);
    kernels::router_topk(kCpu, dims, p.data(), bias.data(), chosen.data(), w.data());
    // Row 0: 0.40, 0.35 (0.20 + bias), 0.30: experts 0 then 2. Row 1: 0.45 (expert 2)
    // then 0.40 (expert 3). Row 2: expert 2 (biased), then the lowest tie, 0.
    CHECK(chosen == std::vector<int>{0, 2, 2, 3, 2, 0});
    const float s0 = norm ? 0.40f + 0.20f : 1.0f;
    CHECK(w[0] == Approx(0.40f / s0));
    CHECK(w[1] == Approx(0.20f / s0));
  }
}

TEST_CASE("router_load and router_losses: the Switch aux loss and z-loss by definition",
          "[router]") {
  const int64_t T = 9;
  const int E = 5, k = 2, n_samples = 2;
  auto logits = randn(T * E, "rk_loss");
  std::vector<int> sample = {0, 1, 1, 0, 0, 1, 0, 1, 1};
  kernels::RouterDims dims{T, E, k, kernels::RouterScore::softmax, true};
  std::vector<float> p(T * E), lse(T), w(T * k);
  std::vector<int> chosen(T * k);
  kernels::router_scores(kCpu, dims, logits.data(), p.data(), lse.data());
  kernels::router_topk(kCpu, dims, p.data(), nullptr, chosen.data(), w.data());
  std::vector<double> stats(n_samples * (E + 1), -1.0);
  kernels::router_load(kCpu, dims, chosen.data(), sample.data(), n_samples, stats.data());
  std::vector<double> f(n_samples * E), inv(n_samples);
  for (int s = 0; s < n_samples; ++s) {
    double Ts = 0;
    for (int64_t t = 0; t < T; ++t) Ts += sample[t] == s;
    CHECK(stats[s * (E + 1) + E] == Ts);
    inv[s] = 1.0 / Ts;
    for (int e = 0; e < E; ++e) {
      double copies = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int j = 0; j < k; ++j) copies += sample[t] == s && chosen[t * k + j] == e;
      CHECK(stats[s * (E + 1) + e] == copies);
      f[s * E + e] = copies / (Ts * k);
    }
  }
  kernels::RouterLossTerms terms{sample.data(), f.data(), inv.data(), 0.03, 0.002};
  double aux = 0, z = 0;
  kernels::router_losses(kCpu, dims, p.data(), lse.data(), terms, &aux, &z);
  double want_aux = 0, want_z = 0;
  for (int s = 0; s < n_samples; ++s) {
    for (int e = 0; e < E; ++e) {
      double P = 0;
      for (int64_t t = 0; t < T; ++t) P += sample[t] == s ? double(p[t * E + e]) * inv[s] : 0.0;
      want_aux += 0.03 * E * f[s * E + e] * P;
    }
    for (int64_t t = 0; t < T; ++t)
      if (sample[t] == s) want_z += 0.002 * double(lse[t]) * lse[t] * inv[s];
  }
  CHECK(aux == Approx(want_aux).epsilon(1e-12));
  CHECK(z == Approx(want_z).epsilon(1e-12));
  CHECK(aux > 0);
}

TEST_CASE("unpermute from segments equals unpermute from one buffer, and its backward", "[moe]") {
  // 8 send rows in 3 segments (one empty), as the shm transport leaves them.
  const int64_t T = 5, d = 7, S = 8;
  const int k = 2;
  std::vector<int64_t> row = {4, 0, 7, -1, 1, 5, 2, 6, 3, -1};
  auto rows = randn(S * d, "seg_rows"), w = randn(T * k, "seg_w"), dy = randn(T * d, "seg_dy");
  std::vector<int64_t> first = {0, 3, 3, 8};
  std::vector<std::vector<float>> seg(3);
  std::vector<const float*> base(3);
  for (int s = 0; s < 3; ++s) {
    seg[s].assign(rows.begin() + first[s] * d, rows.begin() + first[s + 1] * d);
    seg[s].push_back(0.0f);  // never empty, so data() is a real address
    base[s] = seg[s].data();
  }
  const kernels::RowSource split(base.data(), first.data(), 3);
  std::vector<float> y1(T * d), y2(T * d), dr1(S * d, 0.f), dr2(S * d, 0.f), dw1(T * k), dw2(T * k);
  kernels::combine_rows(kCpu, rows.data(), d, row.data(), w.data(), T, k, y1.data());
  kernels::combine_rows(kCpu, split, d, row.data(), w.data(), T, k, y2.data());
  CHECK(y1 == y2);
  kernels::combine_rows_backward(kCpu, rows.data(), dy.data(), d, row.data(), w.data(), T, k,
                                 dr1.data(), dw1.data());
  kernels::combine_rows_backward(kCpu, split, dy.data(), d, row.data(), w.data(), T, k, dr2.data(),
                                 dw2.data());
  CHECK(dr1 == dr2);
  CHECK(dw1 == dw2);
  CHECK(dw1[3] == 0.0f);  // the dropped copy
  // Token 1's second copy was dropped: y is its first copy alone.
  for (int c = 0; c < d; ++c) CHECK(y1[1 * d + c] == w[2] * rows[7 * d + c]);
}
