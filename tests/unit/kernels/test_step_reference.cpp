// The tuned CPU kernels of the rest of the training step against the plain
// references beside them (kernels/cpu/step_reference.hpp): the SwiGLU
// backward, RoPE forward and backward (every frequency rule, positions past
// the kernel's cos/sin table) and AdamW over steps, through the public
// interface (so that a backend behind it is held to the same), on random
// inputs with sizes that leave a remainder after every vector width, and
// asserted relative tolerances.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernel_ctx.hpp"
#include "random.hpp"
#include "step_reference.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/swiglu.hpp"

using namespace trident;
using trident::testing::randn;
namespace ref = trident::kernels::cpu::reference;

namespace {

// ||got - want|| / ||want||, each taken relative to `base` (the values
// before an update, so that the update itself is compared).
double rel_l2(const std::vector<float>& got, const std::vector<float>& want,
              const std::vector<float>* base = nullptr) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double b = base ? double((*base)[i]) : 0.0;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += (double(want[i]) - b) * (double(want[i]) - b);
  }
  return std::isfinite(num) && den > 0 ? std::sqrt(num / den) : INFINITY;
}

}  // namespace

TEST_CASE("tuned swiglu backward matches its plain reference", "[reference][swiglu]") {
  const int64_t T = 19, d = 48, f = 72;
  auto x = randn(T * d, 11), wg = randn(f * d, 12, 0.2f), wu = randn(f * d, 13, 0.2f);
  auto wd = randn(d * f, 14, 0.2f), dy = randn(T * d, 15);
  auto gate = randn(T * f, 16, 2.0f), up = randn(T * f, 17);
  // The weight gradients accumulate onto what is there.
  const auto g0 = randn(f * d, 18, 0.1f), u0 = randn(f * d, 19, 0.1f), d0 = randn(d * f, 20, 0.1f);
  std::vector<float> dx(x.size()), dwg = g0, dwu = u0, dwd = d0;
  std::vector<float> dx_ref(x.size()), dwg_ref = g0, dwu_ref = u0, dwd_ref = d0;
  kernels::swiglu_backward(test::kernel_ctx(), x.data(), gate.data(), up.data(), dy.data(), T, d, f,
                           wg.data(), wu.data(), wd.data(), dx.data(), dwg.data(), dwu.data(),
                           dwd.data());
  ref::swiglu_backward(x.data(), gate.data(), up.data(), dy.data(), T, d, f, wg.data(), wu.data(),
                       wd.data(), dx_ref.data(), dwg_ref.data(), dwu_ref.data(), dwd_ref.data());
  CHECK(rel_l2(dx, dx_ref) <= 1e-5);
  CHECK(rel_l2(dwg, dwg_ref, &g0) <= 1e-5);
  CHECK(rel_l2(dwu, dwu_ref, &u0) <= 1e-5);
  CHECK(rel_l2(dwd, dwd_ref, &d0) <= 1e-5);
  // Without dx: the same weight gradients.
  std::vector<float> dwg2 = g0, dwu2 = u0, dwd2 = d0;
  kernels::swiglu_backward(test::kernel_ctx(), x.data(), gate.data(), up.data(), dy.data(), T, d, f,
                           wg.data(), wu.data(), wd.data(), nullptr, dwg2.data(), dwu2.data(),
                           dwd2.data());
  CHECK(rel_l2(dwg2, dwg_ref, &g0) <= 1e-5);
  CHECK(rel_l2(dwu2, dwu_ref, &u0) <= 1e-5);
  CHECK(rel_l2(dwd2, dwd_ref, &d0) <= 1e-5);
}

TEST_CASE("tuned rope forward and backward match their plain reference", "[reference][rope]") {
  const int64_t T = 13, H = 3, D = 64;
  // Positions in order and not, repeated, and past the kernel's table
  // (2^24 floats / D = 262,144 positions), where it computes directly.
  const std::vector<int64_t> pos = {0,    1,    7,     7,      100,    31,     4095,
                                    4096, 8191, 20000, 262143, 262144, 1000003};
  kernels::RopeFreqs linear(500000.0), llama3(500000.0);
  linear.kind = kernels::RopeKind::linear;
  linear.factor = 4.0;
  llama3.kind = kernels::RopeKind::llama3;
  llama3.factor = 8.0;
  llama3.original_max = 256.0;  // every band of the rule at D = 64
  for (const kernels::RopeFreqs& freqs : {kernels::RopeFreqs(10000.0), linear, llama3}) {
    INFO("rope kind " << int(freqs.kind));
    const auto x0 = randn(T * H * D, 21);
    std::vector<float> x = x0, x_ref = x0;
    kernels::rope_forward(test::kernel_ctx(), x.data(), pos.data(), T, H, D, freqs);
    ref::rope_forward(x_ref.data(), pos.data(), T, H, D, freqs);
    CHECK(rel_l2(x, x_ref) <= 1e-6);
    CHECK(rel_l2(x, x0) > 0.1);  // it turned
    std::vector<float> dx = x0, dx_ref = x0;
    kernels::rope_backward(test::kernel_ctx(), dx.data(), pos.data(), T, H, D, freqs);
    ref::rope_backward(dx_ref.data(), pos.data(), T, H, D, freqs);
    CHECK(rel_l2(dx, dx_ref) <= 1e-6);
    // The backward is the forward's transpose: <R x, y> = <x, Rᵀ y>.
    const auto y = randn(T * H * D, 22);
    std::vector<float> ry = y;
    ref::rope_backward(ry.data(), pos.data(), T, H, D, freqs);
    double a = 0.0, b = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
      a += double(x_ref[i]) * y[i];
      b += double(x0[i]) * ry[i];
    }
    CHECK(std::fabs(a - b) <= 1e-5 * std::sqrt(double(y.size())));
  }
}

TEST_CASE("tuned AdamW matches its plain reference over steps", "[reference][adamw]") {
  const int64_t n = 1000 + 7;
  kernels::AdamWHyper h;
  h.lr = 0.1;  // updates well above the rounding of p to float
  h.weight_decay = 0.1;
  for (const bool decay : {true, false}) {
    INFO("decay " << decay);
    auto p = randn(n, 31), p_ref = p;
    std::vector<float> m(size_t(n), 0.0f), v(size_t(n), 0.0f), m_ref = m, v_ref = v;
    for (int64_t step = 1; step <= 20; ++step) {
      INFO("step " << step);
      const auto g = randn(n, 100 + uint64_t(step), step % 3 == 0 ? 3.0f : 0.5f);
      const float scale = step % 2 ? 1.0f : 0.7f;  // clipping folded in
      const std::vector<float> before = p_ref;
      kernels::adamw_step(test::kernel_ctx(), p.data(), g.data(), m.data(), v.data(), n, h, step,
                          scale, decay);
      ref::adamw_step(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, h, step, scale, decay);
      CHECK(rel_l2(p, p_ref, &before) <= 1e-5);  // the update itself
      CHECK(rel_l2(m, m_ref) <= 1e-6);
      CHECK(rel_l2(v, v_ref) <= 1e-6);
      p = p_ref, m = m_ref, v = v_ref;  // each step from the same state
    }
  }
}
