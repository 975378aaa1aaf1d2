// MoE layer with ep in {1, 2, 4, 8} (those dividing the world) against the
// one-rank computation of the same global tokens: outputs, dx, router and
// expert gradients, aux and z losses, tokens per expert. Samples are split
// over cp pairs, so the aux statistics must be reduced over cp to match.
#include <algorithm>
#include <catch2/catch.hpp>

#include "../../unit/ep/ep_test_util.hpp"
#include "ep_fixtures.hpp"
#include "ep_mesh.hpp"
#include "trident/core/tensor.hpp"
#include "trident/parallel/ep/moe_layer.hpp"

using namespace trident;
using namespace trident::ep;
using trident::testing::host_rows;
using trident::testing::randn;

namespace {

struct Case {
  const char* name;
  std::string router = "softmax";
  bool norm_topk = true;
  int top_k = 2;
  bool zero_router = false;  // every token ties onto experts 0..k-1
  bool bias = false;         // sigmoid_bias with a non-zero bias
};

void run_case(const Case& cs, int ep, const char* transport) {
  const int W = testing::world_size(), rank = testing::world_rank();
  const int cp = W % 2 == 0 ? 2 : 1, dp = W / cp;
  eptest::EpMesh mesh(ep, cp);
  const ModelConfig cfg =
      testing::moe_layer_config({.top_k = cs.top_k,
                                 .init_std = 0.4,
                                 .aux_loss = 0.05,
                                 .z_loss = 0.01,
                                 .router = *parse_config_name<RouterScoring>(cs.router),
                                 .norm_topk = cs.norm_topk});
  const int d = cfg.d_model, E = cfg.n_experts, k = cfg.top_k;
  // Each rank: 2 samples x 5 tokens (its cp slice of 2 samples of 5*cp tokens).
  const int per_sample = 5, T = 2 * per_sample, Tg = T * W;
  const float daux = 0.37f;

  // The global token set, in rank order; sample ids global (dp group * 2 + s).
  auto xg = randn(int64_t(Tg) * d, "ep_parity_x");
  auto dyg = randn(int64_t(Tg) * d, "ep_parity_dy");
  std::vector<int> sample_g(Tg);
  for (int r = 0; r < W; ++r)
    for (int t = 0; t < T; ++t) sample_g[r * T + t] = (r / cp) * 2 + t / per_sample;

  auto prepare = [&](MoELayer& l) {
    if (cs.zero_router) l.router_weight().value.zero();
    if (cs.bias)
      for (int e = 0; e < E; ++e) l.router().bias()[e] = 0.05f * float((e * 5) % 8) - 0.2f;
  };
  MoELayer ref(cfg, 2, nullptr, nullptr);
  prepare(ref);
  std::vector<float> yg(xg.size()), dxg(xg.size());
  MoELayer::Cache rc;
  MoEStats rs;
  ref.forward(host_rows(xg, d), sample_g, 2 * dp, host_rows(yg, d), rc, rs);
  ref.backward(host_rows(dyg, d), host_rows(dxg, d), rc, daux);

  MoELayer layer(cfg, 2, mesh.ep_comm.get(), mesh.cp_comm.get(),
                 *parse_config_name<EpTransportChoice>(transport));
  prepare(layer);
  if (ep > 1) REQUIRE(ep_transport_name(layer.dispatcher().transport()) == std::string(transport));
  REQUIRE(layer.local_experts() == E / ep);
  std::vector<int> sample(T);
  for (int t = 0; t < T; ++t) sample[t] = t / per_sample;
  const int64_t off = int64_t(rank) * T * d;
  std::vector<float> y(T * d), dx(T * d);
  MoELayer::Cache c;
  MoEStats st;
  layer.forward(host_rows(xg, int64_t(rank) * T, T, d), sample, 2, host_rows(y, d), c, st);
  layer.backward(host_rows(dyg, int64_t(rank) * T, T, d), host_rows(dx, d), c, daux);

  INFO("case " << cs.name << " ep " << ep << " cp " << cp << " transport " << transport << " rank "
               << rank);
  CHECK(rel_l2_diff(y.data(), yg.data() + off, T * d) < 1e-5);
  CHECK(rel_l2_diff(dx.data(), dxg.data() + off, T * d) < 1e-5);
  REQUIRE(c.router_logits().numel() == int64_t(T) * E);
  CHECK(rel_l2_diff(c.router_logits().ptr(), rc.router_logits().ptr() + int64_t(rank) * T * E,
                    T * E) < 1e-5);

  double losses[2] = {st.aux_loss_sum, st.z_loss_sum};
  mesh.world->allreduce_sum(losses, 2);
  CHECK(losses[0] == Approx(rs.aux_loss_sum).epsilon(1e-5));
  CHECK(losses[1] == Approx(rs.z_loss_sum).epsilon(1e-5));
  CHECK(rs.aux_loss_sum > 0);

  auto counts = st.tokens_per_expert;
  mesh.world->allreduce_sum(counts.data(), counts.size());
  CHECK(counts == rs.tokens_per_expert);
  int64_t total = 0;
  for (auto v : counts) total += v;
  CHECK(total == int64_t(Tg) * k);

  auto& rw = layer.router_weight().grad;
  mesh.world->allreduce_sum(rw.ptr(), rw.numel());
  CHECK(rel_l2_diff(rw.ptr(), ref.router_weight().grad.ptr(), rw.numel()) < 1e-5);
  for (int e = 0; e < layer.local_experts(); ++e) {
    const int g = layer.first_local_expert() + e;
    for (int w = 0; w < 3; ++w) {
      Param& p = layer.expert_param(e, w);
      Param& q = ref.expert_param(g, w);
      REQUIRE(p.name == q.name);
      CHECK(std::ranges::equal(p.value.values(), q.value.values()));
      mesh.replicas->allreduce_sum(p.grad.ptr(), p.grad.numel());
      if (rs.tokens_per_expert[g] == 0) {
        for (float v : p.grad.values()) CHECK(v == 0.0f);
      } else {
        CHECK(rel_l2_diff(p.grad.ptr(), q.grad.ptr(), p.grad.numel()) < 1e-5);
      }
    }
  }
}

// Both transports of the token exchange (the test ranks share one node).
const char* const kTransports[] = {"alltoallv", "shm"};

std::vector<int> ep_sizes() {
  std::vector<int> out;
  for (int ep : {1, 2, 4, 8})
    if (testing::world_size() % ep == 0) out.push_back(ep);
  return out;
}

}  // namespace

TEST_CASE("MoE layer with ep equals the one-rank layer (softmax, renormalised top-2)", "[ep]") {
  for (const char* tr : kTransports)
    for (int ep : ep_sizes()) run_case({"softmax"}, ep, tr);
}

TEST_CASE("MoE layer with ep equals the one-rank layer (sigmoid_bias, top-3)", "[ep]") {
  Case cs{"sigmoid_bias"};
  cs.router = "sigmoid_bias";
  cs.norm_topk = false;
  cs.top_k = 3;
  cs.bias = true;
  for (const char* tr : kTransports)
    for (int ep : ep_sizes()) run_case(cs, ep, tr);
}

TEST_CASE("MoE layer with ep: all tokens on one expert, ranks that receive nothing", "[ep]") {
  Case cs{"top-1 onto expert 0"};
  cs.top_k = 1;
  cs.zero_router = true;
  Case cs2{"top-2 onto experts 0 and 1"};
  cs2.zero_router = true;
  for (const char* tr : kTransports)
    for (int ep : ep_sizes()) {
      run_case(cs, ep, tr);
      run_case(cs2, ep, tr);
    }
}
