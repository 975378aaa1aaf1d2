// The model's CPU ops against finite differences and their defining formulas.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernel_ctx.hpp"
#include "random.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/ops.hpp"

using namespace trident;
using trident::testing::randn;

TEST_CASE("rmsnorm backward matches finite differences", "[ops]") {
  const int64_t T = 3, d = 8;
  auto x = randn(T * d, 1), w = randn(d, 2), g = randn(T * d, 3);
  std::vector<float> y(T * d), r(T), dx(T * d), dw(d, 0.0f);
  kernels::rmsnorm_forward(test::kernel_ctx(), x.data(), w.data(), T, d, 1e-5f, y.data(), r.data());
  kernels::rmsnorm_backward(test::kernel_ctx(), g.data(), x.data(), w.data(), r.data(), T, d,
                            dx.data(), dw.data());
  auto f = [&](const std::vector<float>& xx, const std::vector<float>& ww) {
    std::vector<float> yy(T * d), rr(T);
    kernels::rmsnorm_forward(test::kernel_ctx(), xx.data(), ww.data(), T, d, 1e-5f, yy.data(),
                             rr.data());
    double s = 0;
    for (int64_t i = 0; i < T * d; ++i) s += double(yy[i]) * g[i];
    return s;
  };
  const float h = 1e-2f;
  for (int64_t i = 0; i < T * d; ++i) {
    auto xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    REQUIRE(dx[i] == Approx((f(xp, w) - f(xm, w)) / (2 * h)).margin(2e-3).epsilon(1e-2));
  }
  for (int64_t i = 0; i < d; ++i) {
    auto wp = w, wm = w;
    wp[i] += h;
    wm[i] -= h;
    REQUIRE(dw[i] == Approx((f(x, wp) - f(x, wm)) / (2 * h)).margin(2e-3).epsilon(1e-2));
  }
}

TEST_CASE("rope rotates pairs by pos * theta^(-2i/D) and its backward undoes it", "[ops]") {
  const int64_t T = 4, H = 2, D = 8;
  auto x = randn(T * H * D, 5);
  std::vector<int64_t> pos = {0, 7, 100, 33};
  auto y = x;
  kernels::rope_forward(test::kernel_ctx(), y.data(), pos.data(), T, H, D, 10000.0);
  // position 0: identity; others: the rotation formula
  for (int64_t i = 0; i < H * D; ++i) REQUIRE(y[i] == x[i]);
  const int64_t t = 2, h = 1, i = 1;
  const double a = double(pos[t]) * std::pow(10000.0, -2.0 * i / D);
  const float* xv = &x[(t * H + h) * D];
  REQUIRE(y[(t * H + h) * D + i] ==
          Approx(xv[i] * std::cos(a) - xv[i + D / 2] * std::sin(a)).margin(1e-5));
  // the backward of an orthogonal map is its transpose: <R x, g> = <x, R^T g>
  auto g = randn(T * H * D, 6), gt = g;
  kernels::rope_backward(test::kernel_ctx(), gt.data(), pos.data(), T, H, D, 10000.0);
  double lhs = 0, rhs = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    lhs += double(y[k]) * g[k];
    rhs += double(x[k]) * gt[k];
  }
  REQUIRE(lhs == Approx(rhs).epsilon(1e-5));
}

TEST_CASE("cross-entropy loss and gradient", "[ops]") {
  const int64_t T = 3, V = 5;
  auto z = randn(T * V, 9, 2.0f);
  std::vector<int32_t> tgt = {2, -1, 4};
  std::vector<float> dz(T * V);
  double loss =
      kernels::cross_entropy(test::kernel_ctx(), z.data(), tgt.data(), T, V, 0.5f, dz.data());
  double ref = 0;
  for (int64_t t : {0, 2}) {
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(z[t * V + j]));
    ref += std::log(s) - z[t * V + tgt[t]];
  }
  REQUIRE(loss == Approx(ref).epsilon(1e-6));
  for (int64_t j = 0; j < V; ++j) REQUIRE(dz[1 * V + j] == 0.0f);
  const float h = 1e-2f;
  for (int64_t k : {0, 2, 11, 14}) {
    auto zp = z, zm = z;
    zp[k] += h;
    zm[k] -= h;
    double fp = kernels::cross_entropy(test::kernel_ctx(), zp.data(), tgt.data(), T, V, 0, nullptr);
    double fm = kernels::cross_entropy(test::kernel_ctx(), zm.data(), tgt.data(), T, V, 0, nullptr);
    REQUIRE(dz[k] == Approx(0.5 * (fp - fm) / (2 * h)).margin(1e-4).epsilon(1e-2));
  }
}

TEST_CASE("linear backward is the transpose of the forward", "[ops]") {
  const int64_t T = 4, in = 6, out = 3;
  auto x = randn(T * in, 11), w = randn(out * in, 12), g = randn(T * out, 13);
  std::vector<float> y(T * out), dx(T * in), dw(out * in, 0.0f);
  kernels::linear_forward(test::kernel_ctx(), x.data(), w.data(), T, in, out, y.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t i = 0; i < in; ++i) s += double(x[t * in + i]) * w[o * in + i];
      REQUIRE(y[t * out + o] == Approx(s).epsilon(1e-5));
    }
  kernels::linear_backward_input(test::kernel_ctx(), g.data(), w.data(), T, in, out, dx.data());
  kernels::linear_backward_weight(test::kernel_ctx(), g.data(), x.data(), T, in, out, dw.data());
  double s1 = 0, s2 = 0, s3 = 0;
  for (int64_t k = 0; k < T * out; ++k) s1 += double(y[k]) * g[k];
  for (int64_t k = 0; k < T * in; ++k) s2 += double(x[k]) * dx[k];
  for (int64_t k = 0; k < out * in; ++k) s3 += double(w[k]) * dw[k];
  REQUIRE(s2 == Approx(s1).epsilon(1e-5));
  REQUIRE(s3 == Approx(s1).epsilon(1e-5));
}

TEST_CASE("adamw step follows the bias-corrected update with decoupled decay", "[ops]") {
  std::vector<float> p = {1.0f, -2.0f}, g = {0.5f, -0.25f}, m = {0, 0}, v = {0, 0};
  kernels::AdamWHyper h;
  h.lr = 0.1;
  h.weight_decay = 0.1;
  kernels::adamw_step(test::kernel_ctx(), p.data(), g.data(), m.data(), v.data(), 2, h, 1, 0.5f,
                      true);
  // step 1: m_hat = g', v_hat = g'^2, so the move is lr * sign(g') (eps aside)
  REQUIRE(p[0] == Approx(1.0 * (1 - 0.01) - 0.1).epsilon(1e-5));
  REQUIRE(p[1] == Approx(-2.0 * (1 - 0.01) + 0.1).epsilon(1e-5));
  REQUIRE(m[0] == Approx(0.1 * 0.25).epsilon(1e-6));
}

TEST_CASE("embedding backward scatters into the rows it read", "[ops]") {
  const int64_t V = 4, d = 3;
  auto table = randn(V * d, 21);
  std::vector<int32_t> ids = {2, 0, 2};
  std::vector<float> out(3 * d);
  kernels::embedding_forward(test::kernel_ctx(), table.data(), ids.data(), 3, d, out.data());
  REQUIRE(out[d + 1] == table[1]);
  auto g = randn(3 * d, 22);
  std::vector<float> dt(V * d, 0.0f);
  kernels::embedding_backward(test::kernel_ctx(), g.data(), ids.data(), 3, d, dt.data());
  REQUIRE(dt[2 * d] == Approx(g[0] + g[2 * d]));
  REQUIRE(dt[1 * d] == 0.0f);
}
