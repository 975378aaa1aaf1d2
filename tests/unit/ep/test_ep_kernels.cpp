// SwiGLU and MoE token kernels against plain double-precision references and
// central finite differences.
#include <catch2/catch.hpp>
#include <cmath>

#include "ep_test_util.hpp"
#include "kernel_ctx.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/moe.hpp"
#include "trident/kernels/router.hpp"
#include "trident/kernels/swiglu.hpp"

using namespace trident;
using trident::testing::randn;

namespace {
// y = (silu(x Wgᵀ) * (x Wuᵀ)) Wdᵀ in double (weights [out, in]), loss = sum(y * g).
double ref_swiglu_loss(const std::vector<double>& x, const std::vector<double>& wg,
                       const std::vector<double>& wu, const std::vector<double>& wd,
                       const std::vector<float>& g, int T, int d, int f,
                       std::vector<double>* y_out = nullptr) {
  double loss = 0;
  if (y_out) y_out->assign(size_t(T) * d, 0.0);
  for (int t = 0; t < T; ++t) {
    std::vector<double> h(f);
    for (int j = 0; j < f; ++j) {
      double a = 0, b = 0;
      for (int i = 0; i < d; ++i) {
        a += x[t * d + i] * wg[j * d + i];
        b += x[t * d + i] * wu[j * d + i];
      }
      h[j] = a / (1.0 + std::exp(-a)) * b;
    }
    for (int c = 0; c < d; ++c) {
      double y = 0;
      for (int j = 0; j < f; ++j) y += h[j] * wd[c * f + j];
      if (y_out) (*y_out)[t * d + c] = y;
      loss += y * g[t * d + c];
    }
  }
  return loss;
}
std::vector<double> to_d(const std::vector<float>& v) { return {v.begin(), v.end()}; }
}  // namespace

TEST_CASE("swiglu forward matches the double reference", "[swiglu]") {
  const int T = 7, d = 12, f = 20;
  auto x = randn(T * d, "x"), wg = randn(d * f, "wg", 0.3f), wu = randn(d * f, "wu", 0.3f),
       wd = randn(f * d, "wd", 0.3f), g = randn(T * d, "g");
  std::vector<float> y(T * d), gate(T * f), up(T * f);
  kernels::swiglu_forward(test::kernel_ctx(), x.data(), T, d, f, wg.data(), wu.data(), wd.data(),
                          y.data(), gate.data(), up.data());
  std::vector<double> yref;
  ref_swiglu_loss(to_d(x), to_d(wg), to_d(wu), to_d(wd), g, T, d, f, &yref);
  std::vector<float> yref_f(yref.begin(), yref.end());
  CHECK(rel_l2_diff(y.data(), yref_f.data(), T * d) < 1e-5);
}

TEST_CASE("swiglu backward matches finite differences and accumulates", "[swiglu]") {
  const int T = 5, d = 8, f = 12;
  auto x = randn(T * d, "bx"), wg = randn(d * f, "bwg", 0.4f), wu = randn(d * f, "bwu", 0.4f),
       wd = randn(f * d, "bwd", 0.4f), g = randn(T * d, "bg");
  std::vector<float> y(T * d), gate(T * f), up(T * f), dx(T * d);
  std::vector<float> dwg(d * f, 0.f), dwu(d * f, 0.f), dwd(f * d, 0.f);
  kernels::swiglu_forward(test::kernel_ctx(), x.data(), T, d, f, wg.data(), wu.data(), wd.data(),
                          y.data(), gate.data(), up.data());
  kernels::swiglu_backward(test::kernel_ctx(), x.data(), gate.data(), up.data(), g.data(), T, d, f,
                           wg.data(), wu.data(), wd.data(), dx.data(), dwg.data(), dwu.data(),
                           dwd.data());
  // Every coordinate of every input, central differences in double.
  const double eps = 1e-5;
  auto check = [&](std::vector<float>& param, const std::vector<float>& grad, const char* name) {
    INFO(name);
    double worst = 0;
    for (size_t i = 0; i < param.size(); ++i) {
      std::vector<double> xd = to_d(x), wgd = to_d(wg), wud = to_d(wu), wdd = to_d(wd);
      std::vector<double>* p = &param == &x    ? &xd
                               : &param == &wg ? &wgd
                               : &param == &wu ? &wud
                                               : &wdd;
      (*p)[i] += eps;
      double lp = ref_swiglu_loss(xd, wgd, wud, wdd, g, T, d, f);
      (*p)[i] -= 2 * eps;
      double lm = ref_swiglu_loss(xd, wgd, wud, wdd, g, T, d, f);
      double num = (lp - lm) / (2 * eps);
      worst = std::max(worst, std::fabs(num - grad[i]) / std::max(1.0, std::fabs(num)));
    }
    CHECK(worst < 1e-4);
  };
  check(x, dx, "dx");
  check(wg, dwg, "dw_gate");
  check(wu, dwu, "dw_up");
  check(wd, dwd, "dw_down");
  // A second call adds the same weight gradient again.
  auto dwd1 = dwd;
  kernels::swiglu_backward(test::kernel_ctx(), x.data(), gate.data(), up.data(), g.data(), T, d, f,
                           wg.data(), wu.data(), wd.data(), nullptr, dwg.data(), dwu.data(),
                           dwd.data());
  for (size_t i = 0; i < dwd.size(); ++i) CHECK(dwd[i] == Approx(2 * dwd1[i]).epsilon(1e-6));
}

TEST_CASE("topk_rows picks the k largest, ties to the lower expert", "[moe]") {
  std::vector<float> s = {0.1f, 0.7f, 0.3f, 0.7f, 0.2f,  //
                          1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  std::vector<int> idx(2 * 3);
  kernels::topk_rows(kernels::Ctx{}, s.data(), nullptr, 2, 5, 3, idx.data());
  CHECK(idx == std::vector<int>{1, 3, 2, 0, 1, 2});
}

TEST_CASE("combine and scatter-add are the adjoints of each other", "[moe]") {
  // <combine(rows), dy> == <rows, combine_backward(dy)> and gather/scatter likewise.
  const int T = 6, k = 2, d = 5;
  std::vector<int64_t> row = {3, 0, -1, 5, 1, 2, 4, -1, 6, 7, 8, 9};
  const int S = 10;
  auto rows = randn(S * d, "rows"), w = randn(T * k, "w"), dy = randn(T * d, "dy");
  std::vector<float> y(T * d), drows(S * d, 0.f), dw(T * k);
  const kernels::Ctx ctx;
  kernels::combine_rows(ctx, rows.data(), d, row.data(), w.data(), T, k, y.data());
  kernels::combine_rows_backward(ctx, rows.data(), dy.data(), d, row.data(), w.data(), T, k,
                                 drows.data(), dw.data());
  CHECK(eptest::dot(y, dy) == Approx(eptest::dot(rows, drows)).epsilon(1e-5));
  // dweight is the derivative of <y, dy> in each weight.
  for (int i = 0; i < T * k; ++i) {
    double expect = 0;
    if (row[i] >= 0)
      for (int c = 0; c < d; ++c) expect += double(dy[(i / k) * d + c]) * rows[row[i] * d + c];
    CHECK(dw[i] == Approx(expect).epsilon(1e-5).margin(1e-6));
  }
  auto x = randn(T * d, "gx");
  std::vector<int64_t> src(S);
  for (int i = 0; i < T * k; ++i)
    if (row[i] >= 0) src[row[i]] = i / k;
  std::vector<float> gathered(S * d), dx(T * d);
  kernels::gather_rows(ctx, x.data(), d, src.data(), S, gathered.data());
  kernels::scatter_add_rows(ctx, drows.data(), d, row.data(), T, k, dx.data());
  CHECK(eptest::dot(gathered, drows) == Approx(eptest::dot(x, dx)).epsilon(1e-5));
}
