// The op interface itself: AdamW over many steps against an fp64 reference,
// the buffer ops (copy, fill, add, sum of squares), SwiGLU and sgemm through
// a Ctx with and without a workspace, and the routing of a cuda Ctx in a
// build without the CUDA backend.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "kernel_ctx.hpp"
#include "random.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/swiglu.hpp"

using namespace trident;
using trident::testing::randn;

namespace {

// AdamW (decoupled decay, bias-corrected moments) in fp64, the textbook form.
struct AdamWReference {
  std::vector<double> p, m, v;
  void step(const std::vector<float>& g, const kernels::AdamWHyper& h, int64_t t, double scale) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = double(g[i]) * scale;
      m[i] = h.beta1 * m[i] + (1 - h.beta1) * gi;
      v[i] = h.beta2 * v[i] + (1 - h.beta2) * gi * gi;
      const double m_hat = m[i] / (1 - std::pow(h.beta1, double(t)));
      const double v_hat = v[i] / (1 - std::pow(h.beta2, double(t)));
      p[i] -= h.lr * h.weight_decay * p[i];
      p[i] -= h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
    }
  }
};

double max_rel(const std::vector<float>& a, const std::vector<double>& b, double floor) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / std::max(std::fabs(b[i]), floor));
  return worst;
}

}  // namespace

TEST_CASE("adamw over 12 steps from random p, m, v equals the fp64 reference", "[interface]") {
  const size_t n = 257;
  auto p = randn(n, "adamw.p"), m = randn(n, "adamw.m", 0.1f), v = randn(n, "adamw.v", 0.01f);
  for (float& x : v) x = x * x;  // a second moment is non-negative
  kernels::AdamWHyper h;
  h.lr = 3e-3;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  AdamWReference ref{{p.begin(), p.end()}, {m.begin(), m.end()}, {v.begin(), v.end()}};
  // Resumed at step 5, so that the bias corrections are not those of step 1.
  for (int64_t t = 5; t < 17; ++t) {
    const auto g = randn(n, ("adamw.g" + std::to_string(t)).c_str());
    const float scale = t % 3 == 0 ? 0.5f : 1.0f;
    kernels::adamw_step(test::kernel_ctx(), p.data(), g.data(), m.data(), v.data(), int64_t(n), h,
                        t, scale, true);
    ref.step(g, h, t, scale);
  }
  // Relative to each value, with a floor near the values' scale (|p| ~ 1,
  // |m| ~ 0.1, v ~ 0.1) so that fp32 rounding of a value near 0 does not count.
  CHECK(max_rel(p, ref.p, 1e-1) < 1e-5);
  CHECK(max_rel(m, ref.m, 1e-2) < 1e-5);
  CHECK(max_rel(v, ref.v, 1e-2) < 1e-5);

  // The same reference with beta2 off by 0.01 or without the second bias
  // correction is far away: the comparison above can fail.
  AdamWReference wrong{{p.begin(), p.end()}, {m.begin(), m.end()}, {v.begin(), v.end()}};
  kernels::AdamWHyper h2 = h;
  h2.beta2 = 0.96;
  const auto g = randn(n, "adamw.g.extra");
  std::vector<float> p2 = p, m2 = m, v2 = v;
  kernels::adamw_step(test::kernel_ctx(), p2.data(), g.data(), m2.data(), v2.data(), int64_t(n), h,
                      17, 1.0f, true);
  wrong.step(g, h2, 17, 1.0);
  CHECK(max_rel(v2, wrong.v, 1e-2) > 1e-3);
}

TEST_CASE("adamw without decay leaves the decay term out", "[interface]") {
  std::vector<float> p = {2.0f}, g = {0.0f}, m = {0.0f}, v = {0.0f};
  kernels::AdamWHyper h;
  h.lr = 0.1;
  h.weight_decay = 0.5;
  kernels::adamw_step(test::kernel_ctx(), p.data(), g.data(), m.data(), v.data(), 1, h, 3, 1.0f,
                      false);
  CHECK(p[0] == 2.0f);
  kernels::adamw_step(test::kernel_ctx(), p.data(), g.data(), m.data(), v.data(), 1, h, 4, 1.0f,
                      true);
  CHECK(p[0] == Approx(2.0 * (1 - 0.05)).epsilon(1e-6));
}

TEST_CASE("blas_kernels names the BLAS and the kernels it runs here", "[interface]") {
  const std::string name = kernels::blas_kernels();
  if (kernels::have_blas()) {
    // "OpenBLAS " and the name OpenBLAS gives its kernels (Haswell, SkylakeX, ...)
    REQUIRE(name.rfind("OpenBLAS ", 0) == 0);
    CHECK(name.size() > std::string("OpenBLAS ").size());
    CHECK(name.find("unknown") == std::string::npos);
  } else {
    CHECK(name == "none (reference loops)");
  }
}

TEST_CASE("buffer ops: copy, fill, add, sum of squares", "[interface]") {
  const kernels::Ctx& ctx = test::kernel_ctx();
  const auto x = randn(1000, "buf.x");
  std::vector<float> y(1000, 7.0f);
  kernels::copy(ctx, y.data() + 1, x.data(), 998);
  CHECK(y[0] == 7.0f);
  CHECK(y[999] == 7.0f);
  for (int i = 0; i < 998; ++i) REQUIRE(y[size_t(i) + 1] == x[size_t(i)]);
  kernels::fill(ctx, y.data(), 500, -1.5f);
  for (int i = 0; i < 500; ++i) REQUIRE(y[size_t(i)] == -1.5f);
  CHECK(y[500] == x[499]);
  std::vector<float> z = x;
  kernels::add_inplace(ctx, z.data(), x.data(), 1000);
  for (int i = 0; i < 1000; ++i) REQUIRE(z[size_t(i)] == 2.0f * x[size_t(i)]);
  double ref = 0;
  for (float a : x) ref += double(a) * double(a);
  CHECK(kernels::sum_squares(ctx, x.data(), 1000) == ref);
  CHECK(kernels::sum_squares(ctx, x.data(), 0) == 0.0);
}

TEST_CASE("sgemm and swiglu give the same bits with and without a workspace", "[interface]") {
  const int64_t T = 37, d = 24, f = 40;
  const auto x = randn(size_t(T * d), "sw.x"), wg = randn(size_t(d * f), "sw.wg", 0.2f),
             wu = randn(size_t(d * f), "sw.wu", 0.2f), wd = randn(size_t(f * d), "sw.wd", 0.2f),
             dy = randn(size_t(T * d), "sw.dy");
  const kernels::Ctx bare{};  // no workspace: the kernel allocates its scratch
  struct Out {
    std::vector<float> y, gate, up, dx, dwg, dwu, dwd;
  };
  auto run = [&](const kernels::Ctx& ctx) {
    Out o{std::vector<float>(size_t(T * d)), std::vector<float>(size_t(T * f)),
          std::vector<float>(size_t(T * f)), std::vector<float>(size_t(T * d)),
          std::vector<float>(size_t(d * f)), std::vector<float>(size_t(d * f)),
          std::vector<float>(size_t(f * d))};
    kernels::swiglu_forward(ctx, x.data(), T, d, f, wg.data(), wu.data(), wd.data(), o.y.data(),
                            o.gate.data(), o.up.data());
    kernels::swiglu_backward(ctx, x.data(), o.gate.data(), o.up.data(), dy.data(), T, d, f,
                             wg.data(), wu.data(), wd.data(), o.dx.data(), o.dwg.data(),
                             o.dwu.data(), o.dwd.data());
    return o;
  };
  const Out a = run(bare), b = run(test::kernel_ctx());
  CHECK(a.y == b.y);
  CHECK(a.dx == b.dx);
  CHECK(a.dwg == b.dwg);
  CHECK(a.dwd == b.dwd);
  // y = (silu(x Wgᵀ) * (x Wuᵀ)) Wdᵀ (weights [out, in]), one element in fp64.
  double acc = 0;
  for (int64_t j = 0; j < f; ++j) {
    double g = 0, u = 0;
    for (int64_t i = 0; i < d; ++i) {
      g += double(x[size_t(i)]) * wg[size_t(j * d + i)];
      u += double(x[size_t(i)]) * wu[size_t(j * d + i)];
    }
    acc += g / (1 + std::exp(-g)) * u * wd[size_t(j)];
  }
  CHECK(a.y[0] == Approx(acc).epsilon(1e-4));

  std::vector<float> c1(size_t(T * f)), c2(size_t(T * f), 1.0f);
  kernels::sgemm(bare, false, false, T, f, d, 1.0f, x.data(), d, wg.data(), f, 0.0f, c1.data(), f);
  kernels::sgemm(test::kernel_ctx(), false, false, T, f, d, 1.0f, x.data(), d, wg.data(), f, 0.0f,
                 c2.data(), f);
  CHECK(c1 == c2);
}

TEST_CASE("a host DeviceContext's Ctx points at its workspace", "[interface]") {
  const kernels::DeviceContext host(Device::cpu());
  CHECK(host.ctx().device == Device::cpu());
  REQUIRE(host.ctx().workspace != nullptr);
  CHECK(&host.allocator() == &cpu_allocator());
  CHECK(kernels::select_device(Backend::cpu, 3) == Device::cpu());
}

TEST_CASE("runtime.backend: auto falls back to the host exactly when cuda is refused",
          "[interface]") {
  const Device chosen = kernels::select_device(Backend::automatic, 0);
  if (chosen.is_cuda()) {
    CHECK(kernels::select_device(Backend::cuda, 0) == chosen);
  } else {
    CHECK_THROWS_AS(kernels::select_device(Backend::cuda, 0), InputError);
    CHECK_THROWS_WITH(kernels::select_device(Backend::cuda, 0),
                      Catch::StartsWith("runtime.backend: 'cuda' asked for, but"));
  }
  if (!kernels::built_with_cuda()) {
    // The routing: a cuda Ctx reaches no CPU code and names the op.
    CHECK(chosen == Device::cpu());
    kernels::Ctx cuda_ctx;
    cuda_ctx.device = Device::cuda(0);
    std::vector<float> x(4, 1.0f);
    CHECK_THROWS_WITH(kernels::fill(cuda_ctx, x.data(), 4, 0.0f),
                      Catch::Contains("kernels::fill") && Catch::Contains("no CUDA backend"));
    CHECK(x[0] == 1.0f);
  }
}
