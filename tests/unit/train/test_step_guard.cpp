// first_nonfinite_gradient: the first parameter in model order whose
// gradient holds an inf or a NaN, wherever in the tensor it sits (inside a
// scan block, on a block's edge, in the tail after the last whole block).
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>

#include "kernel_ctx.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/train/step_guard.hpp"

using namespace trident;

namespace {

// Three layers' parameters of sizes around the scan's blocks, random finite
// gradients (large and tiny magnitudes, both signs).
std::vector<Param> random_params(std::mt19937& gen) {
  std::vector<Param> ps;
  ps.emplace_back("head.w", std::vector<int64_t>{5000});
  ps.emplace_back("layers.2.attn.wq", std::vector<int64_t>{4096});
  ps.emplace_back("layers.0.attn.wq", std::vector<int64_t>{2047});
  ps.emplace_back("embedding", std::vector<int64_t>{3, 2049});
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> expo(-120, 120);
  for (Param& p : ps)
    for (int64_t k = 0; k < p.grad.numel(); ++k) p.grad.ptr()[k] = std::ldexp(mant(gen), expo(gen));
  return ps;
}

std::vector<Param*> pointers(std::vector<Param>& ps) {
  std::vector<Param*> out;
  for (Param& p : ps) out.push_back(&p);
  return out;
}

}  // namespace

TEST_CASE("first_nonfinite_gradient finds inf and NaN anywhere, first in model order") {
  std::mt19937 gen(20261202);
  const float bad[] = {
      std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN()};
  std::vector<Param> ps = random_params(gen);
  std::vector<Param*> ptrs = pointers(ps);
  CHECK(train::first_nonfinite_gradient(test::kernel_ctx(), ptrs, 3) == -1);
  // the largest finite values are finite
  ps[0].grad.ptr()[7] = std::numeric_limits<float>::max();
  ps[1].grad.ptr()[9] = -std::numeric_limits<float>::max();
  ps[2].grad.ptr()[11] = std::numeric_limits<float>::denorm_min();
  CHECK(train::first_nonfinite_gradient(test::kernel_ctx(), ptrs, 3) == -1);

  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t n = ps[i].grad.numel();
    // first and last element, both edges of the first block, the tail
    for (int64_t at : {int64_t(0), int64_t(2047), int64_t(2048), n - 1,
                       int64_t(std::uniform_int_distribution<int64_t>(0, n - 1)(gen))}) {
      if (at >= n) continue;
      for (float x : bad) {
        std::vector<Param> q = random_params(gen);
        std::vector<Param*> qp = pointers(q);
        q[i].grad.ptr()[at] = x;
        INFO("param " << q[i].name << " element " << at << " value " << x);
        CHECK(train::first_nonfinite_gradient(test::kernel_ctx(), qp, 3) == int(i));
      }
    }
  }
  // two of them: the one earlier in model order wins, not the earlier in the list
  std::vector<Param> q = random_params(gen);
  std::vector<Param*> qp = pointers(q);
  q[0].grad.ptr()[4999] = bad[2];  // head (after the last layer)
  q[1].grad.ptr()[3000] = bad[0];  // layers.2
  q[3].grad.ptr()[6146] = bad[1];  // embedding, the last element
  CHECK(train::first_nonfinite_gradient(test::kernel_ctx(), qp, 3) == 3);
  q[3].grad.ptr()[6146] = 1.f;
  CHECK(train::first_nonfinite_gradient(test::kernel_ctx(), qp, 3) == 1);
}

namespace {

// ps's gradients moved to the emulated device: all but the last as views of
// one allocation (as the ParamStore holds them), the last in its own.
std::vector<Param> on_device(const kernels::Ctx& ctx, const std::vector<Param>& ps) {
  int64_t total = 0;
  for (size_t i = 0; i + 1 < ps.size(); ++i) total += ps[i].grad.numel();
  const Tensor all = kernels::zeros(ctx, {total});
  std::vector<Param> out;
  int64_t at = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    Param p;
    p.name = ps[i].name;
    const bool last = i + 1 == ps.size();
    p.grad = last ? kernels::zeros(ctx, ps[i].grad.shape()) : all.view(at, ps[i].grad.shape());
    kernels::copy(ctx, p.grad, kernels::clone(ctx, ps[i].grad));
    if (!last) at += ps[i].grad.numel();
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

TEST_CASE("on a device, every gradient is judged by one op over one storage and the others") {
  const kernels::DeviceContext device(Device::emulated());
  const kernels::Ctx& ctx = device.ctx();
  std::mt19937 gen(20261205);
  std::vector<Param> host = random_params(gen);
  std::vector<Param> dev = on_device(ctx, host);
  std::vector<Param*> dp = pointers(dev);
  CHECK(train::first_nonfinite_gradient(ctx, dp, 3) == -1);
  for (size_t i = 0; i < host.size(); ++i) {  // the last one lies outside the storage
    std::vector<Param> h = random_params(gen);
    h[i].grad.ptr()[h[i].grad.numel() - 1] = std::numeric_limits<float>::quiet_NaN();
    std::vector<Param> d = on_device(ctx, h);
    std::vector<Param*> ptrs = pointers(d);
    INFO("param " << h[i].name);
    CHECK(train::first_nonfinite_gradient(ctx, ptrs, 3) == int(i));
  }
  // The order of params need not be the storage's.
  std::vector<Param> h = random_params(gen);
  h[1].grad.ptr()[0] = std::numeric_limits<float>::infinity();
  std::vector<Param> d = on_device(ctx, h);
  std::vector<Param*> ptrs = {&d[3], &d[2], &d[1], &d[0]};
  CHECK(train::first_nonfinite_gradient(ctx, ptrs, 3) == 2);
}
