// The vectorised CPU kernels (issue 28) against fp64 references on shapes
// with vector tails, and the orders and tables that make their bits
// independent of the instruction set and of the call history.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernel_ctx.hpp"
#include "random.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/swiglu.hpp"

using namespace trident;
using trident::testing::randn;

namespace {

double rel_l2(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

}  // namespace

TEST_CASE("sum of squares adds in eight interleaved lanes, the same bits everywhere", "[vector]") {
  for (int64_t n : {0, 1, 5, 8, 9, 63, 64, 1000, 4099}) {
    INFO("n = " << n);
    auto x = randn(size_t(n), 71 + uint64_t(n), 3.0f);
    double acc[8] = {};
    long double exact = 0;
    for (int64_t i = 0; i < n; ++i) {
      acc[i % 8] += double(x[i]) * double(x[i]);
      exact += (long double)x[i] * (long double)x[i];
    }
    const double lanes =
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    const double got = kernels::sum_squares(test::kernel_ctx(), x.data(), n);
    CHECK(got == lanes);
    CHECK(std::fabs(got - double(exact)) <= 1e-13 * double(exact));
  }
}

TEST_CASE("swiglu backward equals the fp64 chain rule, pre-activations over [-30, 30]",
          "[vector]") {
  const int T = 33, d = 16, f = 40;  // T*f and f leave vector tails
  auto x = randn(T * d, 81, 2.0f), wg = randn(f * d, 82, 1.5f), wu = randn(f * d, 83, 0.5f),
       wd = randn(d * f, 84, 0.5f), dy = randn(T * d, 85);
  std::vector<float> y(T * d), gate(T * f), up(T * f), dx(T * d);
  std::vector<float> dwg(f * d, 0.0f), dwu(f * d, 0.0f), dwd(d * f, 0.0f);
  const auto& ctx = test::kernel_ctx();
  kernels::swiglu_forward(ctx, x.data(), T, d, f, wg.data(), wu.data(), wd.data(), y.data(),
                          gate.data(), up.data());
  kernels::swiglu_backward(ctx, x.data(), gate.data(), up.data(), dy.data(), T, d, f, wg.data(),
                           wu.data(), wd.data(), dx.data(), dwg.data(), dwu.data(), dwd.data());
  // fp64 from the same pre-activations (the GEMMs are tested elsewhere)
  std::vector<double> yr(T * d, 0), dxr(T * d, 0), dwgr(f * d, 0), dwur(f * d, 0), dwdr(d * f, 0);
  double lo = 0, hi = 0;
  for (int t = 0; t < T; ++t) {
    std::vector<double> h(f), dh(f, 0);
    for (int j = 0; j < f; ++j) {
      const double a = gate[t * f + j], b = up[t * f + j], s = 1 / (1 + std::exp(-a));
      lo = std::min(lo, a), hi = std::max(hi, a);
      h[j] = a * s * b;
      for (int c = 0; c < d; ++c) dh[j] += double(dy[t * d + c]) * wd[c * f + j];
    }
    for (int c = 0; c < d; ++c) {
      for (int j = 0; j < f; ++j) {
        yr[t * d + c] += h[j] * wd[c * f + j];
        dwdr[c * f + j] += double(dy[t * d + c]) * h[j];
      }
    }
    for (int j = 0; j < f; ++j) {
      const double a = gate[t * f + j], b = up[t * f + j], s = 1 / (1 + std::exp(-a));
      const double dga = dh[j] * b * s * (1 + a * (1 - s)), dup = dh[j] * a * s;
      for (int i = 0; i < d; ++i) {
        dxr[t * d + i] += dga * wg[j * d + i] + dup * wu[j * d + i];
        dwgr[j * d + i] += dga * x[t * d + i];
        dwur[j * d + i] += dup * x[t * d + i];
      }
    }
  }
  CHECK(lo < -20);
  CHECK(hi > 20);
  CHECK(rel_l2(y, yr) < 1e-5);
  CHECK(rel_l2(dx, dxr) < 1e-5);
  CHECK(rel_l2(dwg, dwgr) < 1e-5);
  CHECK(rel_l2(dwu, dwur) < 1e-5);
  CHECK(rel_l2(dwd, dwdr) < 1e-5);
}

TEST_CASE("rope's cached tables give the bits of the direct formula at any position", "[vector]") {
  const int64_t H = 2;
  for (int64_t D : {8, 32}) {
    for (double theta : {10000.0, 500000.0}) {
      INFO("D = " << D << ", theta = " << theta);
      // positions that grow the table, then the same with ones past its cap
      // (2^24 floats: 2^21 positions at D = 8) and a negative one
      const std::vector<std::vector<int64_t>> passes = {{0, 1, 7, 511, 100000, 3, 2, 9, 4},
                                                        {0, 1, 7, 511, 100000, 3, 5000000, -3, 2}};
      for (const auto& pos : passes) {
        const int64_t T = int64_t(pos.size());
        auto x = randn(size_t(T * H * D), 91 + uint64_t(D));
        auto y = x;
        kernels::rope_forward(test::kernel_ctx(), y.data(), pos.data(), T, H, D, theta);
        auto back = y;
        kernels::rope_backward(test::kernel_ctx(), back.data(), pos.data(), T, H, D, theta);
        int wrong = 0;
        double worst = 0;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < D / 2; ++i) {
              const double ang = double(pos[t]) * std::pow(theta, -2.0 * double(i) / double(D));
              const float c = float(std::cos(ang)), s = float(std::sin(ang));
              const float* v = x.data() + (t * H + h) * D;
              const float a = v[i], b = v[i + D / 2];
              const float* r = y.data() + (t * H + h) * D;
              wrong += bits(r[i]) != bits(a * c - b * s);
              wrong += bits(r[i + D / 2]) != bits(a * s + b * c);
              const float* u = back.data() + (t * H + h) * D;
              worst = std::max(worst, double(std::fabs(u[i] - a)) + std::fabs(u[i + D / 2] - b));
            }
        CHECK(wrong == 0);
        CHECK(worst < 1e-5);
      }
    }
  }
}

TEST_CASE("cross-entropy on wide rows equals the fp64 softmax", "[vector]") {
  const int64_t T = 6, V = 257;
  auto z = randn(size_t(T * V), 101, 4.0f);
  std::vector<int32_t> tgt = {0, 256, -1, 17, 100, 3};
  std::vector<float> dz(size_t(T * V), 1.0f);
  const float scale = 0.25f;
  const double loss =
      kernels::cross_entropy(test::kernel_ctx(), z.data(), tgt.data(), T, V, scale, dz.data());
  double ref = 0;
  std::vector<double> dref(size_t(T * V), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    if (tgt[t] < 0) continue;
    double mx = z[t * V];
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(z[t * V + j]));
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(z[t * V + j]) - mx);
    ref += mx + std::log(s) - z[t * V + tgt[t]];
    for (int64_t j = 0; j < V; ++j)
      dref[t * V + j] = scale * std::exp(double(z[t * V + j]) - mx) / s;
    dref[t * V + tgt[t]] -= scale;
  }
  CHECK(loss == Approx(ref).epsilon(1e-9));
  CHECK(rel_l2(dz, dref) < 1e-6);
  int off = 0;
  for (size_t i = 0; i < dz.size(); ++i)
    off += std::fabs(dz[i] - dref[i]) > 1e-5 * std::fabs(dref[i]) + 1e-12;
  CHECK(off == 0);
  // the loss alone (no gradient buffer) is the same number
  CHECK(kernels::cross_entropy(test::kernel_ctx(), z.data(), tgt.data(), T, V, scale, nullptr) ==
        loss);
}

TEST_CASE("rmsnorm forward and backward equal fp64 on rows with vector tails", "[vector]") {
  const int64_t T = 5, d = 67;
  const float eps = 1e-5f;
  auto x = randn(size_t(T * d), 111, 2.0f), w = randn(size_t(d), 112),
       dy = randn(size_t(T * d), 113);
  std::vector<float> y(size_t(T * d)), rstd(static_cast<size_t>(T)), dx(size_t(T * d)),
      dw(size_t(d), 0.5f);
  const auto& ctx = test::kernel_ctx();
  kernels::rmsnorm_forward(ctx, x.data(), w.data(), T, d, eps, y.data(), rstd.data());
  kernels::rmsnorm_backward(ctx, dy.data(), x.data(), w.data(), rstd.data(), T, d, dx.data(),
                            dw.data());
  std::vector<double> yr(size_t(T * d)), dxr(size_t(T * d)), dwr(size_t(d), 0.5);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(x[t * d + i]) * x[t * d + i];
    const double r = 1 / std::sqrt(ss / double(d) + eps);
    CHECK(rstd[size_t(t)] == Approx(r).epsilon(1e-6));
    double mean = 0;
    for (int64_t i = 0; i < d; ++i) mean += double(dy[t * d + i]) * w[i] * x[t * d + i] * r;
    mean /= double(d);
    for (int64_t i = 0; i < d; ++i) {
      const double xh = x[t * d + i] * r;
      yr[t * d + i] = xh * w[i];
      dxr[t * d + i] = r * (double(dy[t * d + i]) * w[i] - xh * mean);
      dwr[i] += double(dy[t * d + i]) * xh;
    }
  }
  CHECK(rel_l2(y, yr) < 1e-6);
  CHECK(rel_l2(dx, dxr) < 1e-5);
  CHECK(rel_l2(dw, dwr) < 1e-6);
}

TEST_CASE("adamw gives every element the bits of a scalar loop without FMA contraction",
          "[vector]") {
  // The vector body (16 or 8 lanes), its remainder and a call of one element
  // must all round a*b + c twice: the kernels are built with
  // -ffp-contract=off, and this file's scalar loop has no FMA to contract to.
  const int64_t n = 16 * 3 + 7;
  const auto p0 = randn(size_t(n), 91, 0.5f), g = randn(size_t(n), 92, 2.0f),
             m0 = randn(size_t(n), 93, 0.1f), v = randn(size_t(n), 94, 0.1f);
  std::vector<float> v0(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v0[size_t(i)] = v[size_t(i)] * v[size_t(i)];
  kernels::AdamWHyper h;
  h.lr = 3e-3;
  h.weight_decay = 0.1;
  const int64_t step = 7;
  const float scale = 0.8f;
  auto p = p0, m = m0, vv = v0;
  kernels::adamw_step(test::kernel_ctx(), p.data(), g.data(), m.data(), vv.data(), n, h, step,
                      scale, true);
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  const float b1 = float(h.beta1), b2 = float(h.beta2), eps = float(h.eps);
  const float step_size = float(h.lr / bc1), inv_sqrt_bc2 = float(1.0 / std::sqrt(bc2));
  const float wd = float(h.lr * h.weight_decay);
  int64_t wrong = 0, wrong_one = 0;
  for (int64_t i = 0; i < n; ++i) {
    // one IEEE operation per statement: nothing to contract
    const float gi = g[size_t(i)] * scale;
    float t1 = b1 * m0[size_t(i)];
    float t2 = (1.0f - b1) * gi;
    const float mi = t1 + t2;
    t1 = b2 * v0[size_t(i)];
    t2 = (1.0f - b2) * gi;
    t2 = t2 * gi;
    const float vi = t1 + t2;
    float denom = std::sqrt(vi) * inv_sqrt_bc2;
    denom = denom + eps;
    float pi = p0[size_t(i)];
    const float decay = wd * pi;
    pi = pi - decay;
    float upd = step_size * mi;
    upd = upd / denom;
    pi = pi - upd;
    wrong += bits(p[size_t(i)]) != bits(pi) || bits(m[size_t(i)]) != bits(mi) ||
             bits(vv[size_t(i)]) != bits(vi);
    // the same element alone (the remainder path)
    float p1 = p0[size_t(i)], m1 = m0[size_t(i)], v1 = v0[size_t(i)];
    kernels::adamw_step(test::kernel_ctx(), &p1, &g[size_t(i)], &m1, &v1, 1, h, step, scale, true);
    wrong_one += bits(p1) != bits(p[size_t(i)]);
  }
  CHECK(wrong == 0);
  CHECK(wrong_one == 0);
}
