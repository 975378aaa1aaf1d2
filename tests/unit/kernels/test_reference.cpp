// The tuned CPU kernels (kernels/cpu: fixed-order vector lanes, vector expf,
// gemm_direct) against the plain references beside them
// (kernels/cpu/reference.hpp), on random inputs with an asserted relative
// tolerance.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernel_ctx.hpp"
#include "random.hpp"
#include "reference.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/swiglu.hpp"

using namespace trident;
using trident::testing::randn;
namespace ref = trident::kernels::cpu::reference;

namespace {

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::isfinite(num) ? std::sqrt(num / den) : INFINITY;
}

}  // namespace

TEST_CASE("tuned rmsnorm matches its plain reference", "[reference]") {
  const int64_t T = 37, d = 100;  // a remainder after every vector width
  auto x = randn(T * d, 1), w = randn(d, 2), dy = randn(T * d, 3), dw0 = randn(d, 4);
  std::vector<float> y(x.size()), r(T), dx(x.size()), dw = dw0;
  std::vector<float> y_ref(x.size()), r_ref(T), dx_ref(x.size()), dw_ref = dw0;
  kernels::rmsnorm_forward(test::kernel_ctx(), x.data(), w.data(), T, d, 1e-5f, y.data(), r.data());
  kernels::rmsnorm_backward(test::kernel_ctx(), dy.data(), x.data(), w.data(), r.data(), T, d,
                            dx.data(), dw.data());
  ref::rmsnorm_forward(x.data(), w.data(), T, d, 1e-5f, y_ref.data(), r_ref.data());
  ref::rmsnorm_backward(dy.data(), x.data(), w.data(), r_ref.data(), T, d, dx_ref.data(),
                        dw_ref.data());
  CHECK(rel_l2(y, y_ref) <= 1e-6);
  CHECK(rel_l2(r, r_ref) <= 1e-6);
  CHECK(rel_l2(dx, dx_ref) <= 1e-5);
  CHECK(rel_l2(dw, dw_ref) <= 1e-5);
}

TEST_CASE("tuned cross-entropy matches its plain reference", "[reference]") {
  const int64_t T = 21, V = 77;
  auto z = randn(T * V, 5, 3.0f);
  std::vector<int32_t> tgt(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tgt[size_t(t)] = t % 5 == 3 ? -1 : int32_t((t * 13) % V);
  std::vector<float> dz(z.size()), dz_ref(z.size());
  const double loss =
      kernels::cross_entropy(test::kernel_ctx(), z.data(), tgt.data(), T, V, 0.25f, dz.data());
  const double loss_ref = ref::cross_entropy(z.data(), tgt.data(), T, V, 0.25f, dz_ref.data());
  CHECK(loss == Approx(loss_ref).epsilon(1e-6));
  CHECK(rel_l2(dz, dz_ref) <= 1e-5);
}

TEST_CASE("tuned swiglu forward matches its plain reference", "[reference]") {
  const int64_t T = 19, d = 48, f = 72;
  auto x = randn(T * d, 6), wg = randn(f * d, 7, 0.2f), wu = randn(f * d, 8, 0.2f);
  auto wd = randn(d * f, 9, 0.2f);
  std::vector<float> y(x.size()), g(T * f), u(T * f), y_ref(x.size()), g_ref(T * f), u_ref(T * f);
  kernels::swiglu_forward(test::kernel_ctx(), x.data(), T, d, f, wg.data(), wu.data(), wd.data(),
                          y.data(), g.data(), u.data());
  ref::swiglu_forward(x.data(), T, d, f, wg.data(), wu.data(), wd.data(), y_ref.data(),
                      g_ref.data(), u_ref.data());
  CHECK(rel_l2(g, g_ref) <= 1e-5);
  CHECK(rel_l2(u, u_ref) <= 1e-5);
  CHECK(rel_l2(y, y_ref) <= 1e-5);
}
