// MoELayer on one rank (all experts local): equals the dense SwiGLU with one
// expert, gradients match finite differences, identity experts round-trip,
// capacity drops leave the residual alone, bf16 expert weights.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <utility>

#include "ep_fixtures.hpp"
#include "ep_test_util.hpp"
#include "kernel_ctx.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/cpu_bf16.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/swiglu.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/parallel/ep/moe_layer.hpp"

using namespace trident;
using namespace trident::ep;
using trident::testing::host_flat;
using trident::testing::host_rows;
using trident::testing::randn;

namespace {
ModelConfig small_cfg(int E, int k) {
  return testing::moe_layer_config(
      {.d_model = 6, .ffn = 10, .experts = E, .top_k = k, .aux_loss = 0.1, .z_loss = 0.01});
}

// Identity experts: y = x; backward dx = dy.
struct IdentityExperts : ExpertBlockFn {
  void forward(int, const Tensor& x, const Tensor& y, const Tensor&, const Tensor&) override {
    REQUIRE(x.shape() == y.shape());
    std::copy(x.values().begin(), x.values().end(), y.values().begin());
  }
  void backward(int, const Tensor&, const Tensor&, const Tensor&, const Tensor& dy,
                const Tensor& dx) override {
    REQUIRE(dy.shape() == dx.shape());
    std::copy(dy.values().begin(), dy.values().end(), dx.values().begin());
  }
};

// One forward and backward: y, dx and every gradient, one after the other.
std::vector<float> run_layer(MoELayer& layer, const std::vector<float>& x,
                             const std::vector<float>& dy, int T) {
  std::vector<float> y(x.size()), dx(x.size());
  MoELayer::Cache c;
  MoEStats st;
  const int64_t d = int64_t(x.size()) / T;
  layer.forward(host_rows(x, d), std::vector<int>(size_t(T), 0), 1, host_rows(y, d), c, st);
  layer.backward(host_rows(dy, d), host_rows(dx, d), c, 1.0f);
  std::vector<float> out = y;
  out.insert(out.end(), dx.begin(), dx.end());
  for (Param* p : layer.params())
    out.insert(out.end(), p->grad.ptr(), p->grad.ptr() + p->grad.numel());
  return out;
}

double layer_objective(MoELayer& layer, const std::vector<float>& x, int T,
                       const std::vector<int>& sample, const std::vector<float>& g, double daux) {
  std::vector<float> y(x.size());
  MoELayer::Cache c;
  MoEStats st;
  const int64_t d = int64_t(x.size()) / T;
  layer.forward(host_rows(x, d), sample, 2, host_rows(y, d), c, st);
  return eptest::dot(y, g) + daux * (st.aux_loss_sum + st.z_loss_sum);
}

// The layer's experts on bf16 copies of their weights (set_gemm_weights),
// kept in copies.
void with_copies(MoELayer& layer, std::map<const Param*, Tensor>& copies) {
  const auto& ctx = test::kernel_ctx();
  for (int e = 0; e < layer.local_experts(); ++e)
    for (int w = 0; w < 3; ++w) {
      const Param& p = layer.expert_param(e, w);
      copies[&p] = kernels::empty(ctx, p.value.shape(), DType::bf16);
      kernels::convert(ctx, p.value, copies[&p]);
    }
  layer.set_gemm_weights([&copies](const Param& p) -> const Tensor& { return copies.at(&p); });
}
}  // namespace

TEST_CASE("one-expert top-1 MoE equals the dense SwiGLU MLP, forward and backward", "[moe]") {
  auto cfg = small_cfg(1, 1);
  cfg.z_loss_coef = 0.0;  // z-loss would give the router a gradient of its own
  MoELayer layer(cfg, 0, nullptr, nullptr);
  const int T = 9, d = cfg.d_model, f = cfg.ffn_hidden;
  auto x = randn(T * d, "dense_x"), dy = randn(T * d, "dense_dy");
  std::vector<int> sample(T, 0);
  std::vector<float> y(T * d), dx(T * d);
  MoELayer::Cache c;
  MoEStats st;
  layer.forward(host_rows(x, d), sample, 1, host_rows(y, d), c, st);
  layer.backward(host_rows(dy, d), host_rows(dx, d), c, 1.0f);

  Param &wg = layer.expert_param(0, 0), &wu = layer.expert_param(0, 1),
        &wd = layer.expert_param(0, 2);
  std::vector<float> yr(T * d), gate(T * f), up(T * f), dxr(T * d);
  std::vector<float> dwg(d * f, 0.f), dwu(d * f, 0.f), dwd(f * d, 0.f);
  kernels::swiglu_forward(test::kernel_ctx(), x.data(), T, d, f, wg.value.ptr(), wu.value.ptr(),
                          wd.value.ptr(), yr.data(), gate.data(), up.data());
  kernels::swiglu_backward(test::kernel_ctx(), x.data(), gate.data(), up.data(), dy.data(), T, d, f,
                           wg.value.ptr(), wu.value.ptr(), wd.value.ptr(), dxr.data(), dwg.data(),
                           dwu.data(), dwd.data());
  CHECK(rel_l2_diff(y.data(), yr.data(), T * d) < 1e-6);
  CHECK(rel_l2_diff(dx.data(), dxr.data(), T * d) < 1e-6);
  CHECK(rel_l2_diff(wg.grad.ptr(), dwg.data(), d * f) < 1e-6);
  CHECK(rel_l2_diff(wu.grad.ptr(), dwu.data(), d * f) < 1e-6);
  CHECK(rel_l2_diff(wd.grad.ptr(), dwd.data(), f * d) < 1e-6);
  // One expert takes everything with weight 1: the router gets no gradient.
  for (float v : layer.router_weight().grad.values()) CHECK(v == 0.0f);
  CHECK(st.tokens_per_expert == std::vector<int64_t>{T});
  CHECK(st.aux_loss_sum == Approx(cfg.aux_loss_coef).epsilon(1e-12));
}

TEST_CASE("MoE layer gradients match finite differences", "[moe]") {
  for (std::string scoring : {"softmax", "sigmoid_bias"}) {
    INFO(scoring);
    auto cfg = small_cfg(4, 2);
    cfg.router = *parse_config_name<RouterScoring>(scoring);
    MoELayer layer(cfg, 3, nullptr, nullptr);
    const int T = 6, d = cfg.d_model;
    auto x = randn(T * d, "fd_x"), g = randn(T * d, "fd_g");
    std::vector<int> sample = {0, 0, 1, 1, 0, 1};
    const double daux = 0.9;
    std::vector<float> y(T * d), dx(T * d);
    MoELayer::Cache c;
    MoEStats st;
    layer.forward(host_rows(x, d), sample, 2, host_rows(y, d), c, st);
    layer.backward(host_rows(g, d), host_rows(dx, d), c, float(daux));
    // Directional derivatives along random directions: fp32 forward, so a
    // step of 1e-2 and a loose tolerance; a wrong term is off by O(1).
    const float eps = 1e-2f;
    auto directional = [&](std::span<float> v, std::span<const float> grad, const char* what) {
      auto dir = randn(int64_t(v.size()), std::string("dir_") + what);
      const std::vector<float> saved(v.begin(), v.end());
      for (size_t i = 0; i < v.size(); ++i) v[i] = saved[i] + eps * dir[i];
      double lp = layer_objective(layer, x, T, sample, g, daux);
      for (size_t i = 0; i < v.size(); ++i) v[i] = saved[i] - eps * dir[i];
      double lm = layer_objective(layer, x, T, sample, g, daux);
      std::copy(saved.begin(), saved.end(), v.begin());
      double num = (lp - lm) / (2 * eps),
             ana = eptest::dot(std::vector<float>(grad.begin(), grad.end()), dir);
      INFO(what << ": numeric " << num << " analytic " << ana);
      CHECK(std::fabs(num - ana) <= 2e-3 * std::max(1.0, std::fabs(num)));
    };
    directional(x, dx, "x");
    directional(layer.router_weight().value.values(), layer.router_weight().grad.values(),
                "router");
    for (int e = 0; e < 4; ++e)
      for (int w = 0; w < 3; ++w)
        directional(layer.expert_param(e, w).value.values(), layer.expert_param(e, w).grad.values(),
                    "expert");
  }
}

TEST_CASE("identity experts with weights 1/k round-trip the input, forward and backward", "[moe]") {
  auto cfg = small_cfg(8, 2);
  cfg.router = RouterScoring::softmax;
  MoELayer layer(cfg, 0, nullptr, nullptr);
  // Zero router: p = 1/8, renormalised top-2 weights are exactly 1/2.
  layer.router_weight().value.zero();
  IdentityExperts id;
  layer.set_expert_fn(&id);
  const int T = 7, d = cfg.d_model;
  auto x = randn(T * d, "id_x"), dy = randn(T * d, "id_dy");
  std::vector<int> sample(T, 0);
  std::vector<float> y(T * d), dx(T * d);
  MoELayer::Cache c;
  MoEStats st;
  layer.forward(host_rows(x, d), sample, 1, host_rows(y, d), c, st);
  layer.backward(host_rows(dy, d), host_rows(dx, d), c, 0.0f);
  CHECK(y == x);
  // The router's part of dx is dlogits·Wᵀ with W = 0.
  CHECK(dx == dy);
  // Everything went to experts 0 and 1 (ties go low): the others got nothing.
  CHECK(st.tokens_per_expert == std::vector<int64_t>{T, T, 0, 0, 0, 0, 0, 0});
  CHECK(st.imbalance() == Approx(4.0));
}

TEST_CASE("capacity drops leave a zero expert output, dropless keeps T*k copies", "[moe]") {
  auto cfg = small_cfg(4, 1);
  cfg.capacity_factor = 0.5;  // ceil(0.5 * 8 * 1 / 4) = 1 per expert
  MoELayer layer(cfg, 0, nullptr, nullptr);
  layer.router_weight().value.zero();  // all tokens tie onto expert 0
  const int T = 8, d = cfg.d_model;
  auto x = randn(T * d, "cap_x");
  std::vector<int> sample(T, 0);
  std::vector<float> y(T * d);
  MoELayer::Cache c;
  MoEStats st;
  layer.forward(host_rows(x, d), sample, 1, host_rows(y, d), c, st);
  CHECK(st.dropped == 7);
  CHECK(st.tokens_per_expert == std::vector<int64_t>{1, 0, 0, 0});
  for (int t = 1; t < T; ++t)
    for (int i = 0; i < d; ++i) CHECK(y[t * d + i] == 0.0f);
  double norm0 = 0;
  for (int i = 0; i < d; ++i) norm0 += std::fabs(y[i]);
  CHECK(norm0 > 0);

  auto cfg2 = small_cfg(4, 2);
  MoELayer dropless(cfg2, 0, nullptr, nullptr);
  dropless.forward(host_rows(x, d), sample, 1, host_rows(y, d), c, st);
  int64_t total = 0;
  for (auto v : st.tokens_per_expert) total += v;
  CHECK(total == T * 2);
  CHECK(st.dropped == 0);
}

TEST_CASE("parameters are named, tagged and initialised independently of ep", "[moe]") {
  auto cfg = small_cfg(8, 2);
  MoELayer layer(cfg, 5, nullptr, nullptr);
  auto ps = layer.params();
  REQUIRE(ps.size() == 1 + 8 * 3);
  CHECK(ps[0]->name == "layers.5.moe.router");
  CHECK(ps[0]->reduce == GradReduce::dense);
  CHECK(ps[1 + 3 * 6 + 2]->name == "layers.5.moe.experts.6.w_down");
  CHECK(ps[1 + 3 * 6 + 2]->reduce == GradReduce::expert);
  Param ref("layers.5.moe.experts.6.w_down", {cfg.d_model, cfg.ffn_hidden});
  ref.init_normal_in_out_keyed(float(cfg.init_std));
  CHECK(std::ranges::equal(ref.value.values(), ps[1 + 3 * 6 + 2]->value.values()));
  // Stored [out, in] = [d, f], element [c, j] has the value the [in, out]
  // order keys at j * d + c.
  const Tensor& wd = ps[1 + 3 * 6 + 2]->value;
  REQUIRE(wd.shape() == std::vector<int64_t>{cfg.d_model, cfg.ffn_hidden});
  const uint64_t key = rng::hash_name("layers.5.moe.experts.6.w_down");
  for (int64_t c = 0; c < cfg.d_model; ++c)
    for (int64_t j = 0; j < cfg.ffn_hidden; ++j)
      CHECK(wd.ptr()[c * cfg.ffn_hidden + j] ==
            float(cfg.init_std) * rng::normal(key, uint64_t(j * cfg.d_model + c)));
  CHECK(layer.buffers().empty());
  cfg.router = RouterScoring::sigmoid_bias;
  MoELayer sig(cfg, 5, nullptr, nullptr);
  REQUIRE(sig.buffers().size() == 1);
  CHECK(sig.buffers()[0]->reduce == GradReduce::none);
}

// train.precision = "bf16": the experts' GEMMs read bf16 copies of their
// weights (set_gemm_weights). Staged, that is the fp32 layer on the rounded
// weights bit for bit (the copies widen exactly, x, dy and the gradients stay
// fp32); native (AVX512-BF16), within the bf16 tolerance of it.
TEST_CASE("bf16 expert weights: staged = fp32 on the rounded weights, native within bf16",
          "[moe]") {
  const auto& ctx = test::kernel_ctx();
  auto cfg = small_cfg(4, 2);
  cfg.d_model = 40;
  cfg.ffn_hidden = 520;
  const int T = 700, d = cfg.d_model;
  const auto x = randn(T * d, "bf16_x"), dy = randn(T * d, "bf16_dy");
  MoELayer fp32(cfg, 0, nullptr, nullptr), rounded(cfg, 0, nullptr, nullptr);
  std::map<const Param*, Tensor> copies;
  for (int e = 0; e < rounded.local_experts(); ++e)
    for (int w = 0; w < 3; ++w) {  // the masters rounded to bf16 in place
      Param& p = rounded.expert_param(e, w);
      const Tensor b = kernels::empty(ctx, p.value.shape(), DType::bf16);
      kernels::convert(ctx, p.value, b);
      kernels::convert(ctx, b, p.value);
    }
  const std::vector<float> ref = run_layer(rounded, x, dy, T),
                           unrounded = run_layer(fp32, x, dy, T);
  kernels::cpu::set_bf16_mode(kernels::cpu::Bf16Mode::staged);
  MoELayer staged(cfg, 0, nullptr, nullptr);
  with_copies(staged, copies);
  const std::vector<float> st = run_layer(staged, x, dy, T);
  REQUIRE(st.size() == ref.size());
  CHECK(st == ref);        // bit for bit
  CHECK(st != unrounded);  // the copies were read
  if (kernels::cpu::bf16_units().avx512_bf16) {
    kernels::cpu::set_bf16_mode(kernels::cpu::Bf16Mode::native);
    MoELayer native(cfg, 0, nullptr, nullptr);
    std::map<const Param*, Tensor> native_copies;
    with_copies(native, native_copies);
    const std::vector<float> nt = run_layer(native, x, dy, T);
    const double err = rel_l2_diff(nt.data(), ref.data(), int64_t(ref.size()));
    INFO("native against staged, relative L2 " << err);
    CHECK(err < 1e-2);  // x and dy rounded too (cpu-kernels.md#native-bf16)
    CHECK(nt != ref);   // the native rows ran
  } else {
    WARN("SKIP native: this CPU has no AVX512-BF16 (the staged comparison ran)");
  }
  kernels::cpu::set_bf16_mode(kernels::cpu::Bf16Mode::automatic);
}

// train.precision = "bf16" also makes the experts' input rows and their
// saved gate and up bf16 (set_expert_activations). Native, the rows are
// rounded once on the expert side where the GEMMs rounded them as they
// packed them: the forward's output keeps its bits; the backward reads gate
// and up rounded (as the dense FFN's), within the bf16 tolerance. Staged,
// within the same tolerance of the f32 rows.
TEST_CASE("bf16 expert activations: native forward bits kept, gradients within bf16", "[moe]") {
  auto cfg = small_cfg(4, 2);
  cfg.d_model = 40;
  cfg.ffn_hidden = 520;
  const int T = 700, d = cfg.d_model;
  const auto x = randn(T * d, "bf16_act_x"), dy = randn(T * d, "bf16_act_dy");
  auto run_both = [&](kernels::cpu::Bf16Mode mode) {
    kernels::cpu::set_bf16_mode(mode);
    MoELayer f32_rows(cfg, 0, nullptr, nullptr), bf16_rows(cfg, 0, nullptr, nullptr);
    std::map<const Param*, Tensor> copies_a, copies_b;
    with_copies(f32_rows, copies_a);
    with_copies(bf16_rows, copies_b);
    bf16_rows.set_expert_activations(DType::bf16);
    return std::pair{run_layer(f32_rows, x, dy, T), run_layer(bf16_rows, x, dy, T)};
  };
  const auto [staged_a, staged_b] = run_both(kernels::cpu::Bf16Mode::staged);
  REQUIRE(staged_a.size() == staged_b.size());
  CHECK(staged_a != staged_b);  // the rows were rounded
  CHECK(rel_l2_diff(staged_b.data(), staged_a.data(), int64_t(staged_a.size())) < 1e-2);
  if (kernels::cpu::bf16_units().avx512_bf16) {
    const auto [native_a, native_b] = run_both(kernels::cpu::Bf16Mode::native);
    const size_t y_end = size_t(T) * size_t(d);
    CHECK(std::equal(native_a.begin(), native_a.begin() + y_end, native_b.begin()));  // y
    CHECK(native_a != native_b);  // gate and up were kept rounded
    const double err = rel_l2_diff(native_b.data(), native_a.data(), int64_t(native_a.size()));
    INFO("bf16 rows against f32 rows, native, relative L2 " << err);
    CHECK(err < 1e-2);
  } else {
    WARN("SKIP native: this CPU has no AVX512-BF16 (the staged comparison ran)");
  }
  kernels::cpu::set_bf16_mode(kernels::cpu::Bf16Mode::automatic);
  MoELayer layer(cfg, 0, nullptr, nullptr);
  CHECK_THROWS_WITH(layer.set_expert_activations(DType::i32), Catch::Contains("f32 or bf16"));
}

TEST_CASE("the dispatcher and the layer refuse rows of the wrong shape, naming them", "[moe]") {
  TokenDispatcher disp(nullptr, 4);
  const int64_t T = 3, d = 4;
  const DispatchPlan p = disp.plan(std::vector<int>{0, 2, 3}, T, 1);
  std::vector<float> x(T * d, 1.0f), short_rows((T - 1) * d), y(T * d), w(T, 1.0f);
  CHECK_THROWS_WITH(disp.dispatch(p, host_rows(x, d), host_rows(short_rows, d)),
                    Catch::Contains("expert_in") && Catch::Contains("3 rows"));
  std::vector<float> expert_side(T * d);
  disp.dispatch(p, host_rows(x, d), host_rows(expert_side, d));
  CHECK_THROWS_WITH(disp.combine(p, host_rows(expert_side, d), host_flat(y), host_rows(y, d)),
                    Catch::Contains("weight"));
  CHECK_THROWS_WITH(
      disp.combine(p, host_rows(expert_side, d), host_flat(w), host_rows(short_rows, d)),
      Catch::Contains("y "));
  disp.combine(p, host_rows(expert_side, d), host_flat(w), host_rows(y, d));
  CHECK(y == x);

  MoELayer layer(small_cfg(4, 2), 0, nullptr, nullptr);
  std::vector<float> wide(T * 7), out(T * 7);
  MoELayer::Cache c;
  MoEStats st;
  CHECK_THROWS_WITH(
      layer.forward(host_rows(wide, 7), std::vector<int>(T, 0), 1, host_rows(out, 7), c, st),
      Catch::Contains("sample_of_token has 3 entries for x [3, 7] (rows of d 6)"));
  const Tensor sample = Tensor::empty({T}, cpu_allocator(), DType::i32);
  CHECK_THROWS_WITH(layer.forward(host_rows(wide, 7), sample, 1, host_rows(out, 7), c, st),
                    Catch::Contains("MoELayer: x and y must be f32 [T, 6], got x [3, 7]"));
}
