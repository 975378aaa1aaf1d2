// Training with cp_mode = "ulysses" and "hybrid" equals the one-rank run:
// per-step losses and gradient norms over 4 steps within 1e-4 (same global
// batch: the reference runs dp x num_microbatches micro-batches). The
// hybrid meshes put the ring across NVLink domains (pp2 x cp4 with u = 2 on
// domains of 2 ranks) and across nodes (cp8 with u = 4 on 2 simulated nodes
// of 4 ranks), which only hybrid may do.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "mpi_test_util.hpp"
#include "tiny_config.hpp"
#include "train_steps.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/check_config.hpp"
#include "trident/train/trainer.hpp"

using namespace trident;
using trident::testing::Curve;

namespace {

// 4 layers, MoE every 2nd; 2 K/V heads: u = 4 replicates each on two ranks.
Config tiny() {
  Config c = testing::tiny_config({.layers = 4, .moe_every = 2}, {},
                                  {.steps = 4, .lr = 1e-2, .warmup = 1, .grad_clip = 0.5});
  return testing::test_run_settings(c);
}

// Bytes all ranks send under the "cp" kind in one step of pure Ulysses (u =
// cp): per layer and sequence, (u-1)/u of q, k, v, out, lse forward and of
// q, k, v, out, lse, dout, dq, dk, dv backward (planner.md's formula), plus
// the router's per-sample load statistics ((n_experts + 1) doubles per MoE
// layer and sequence, summed over the cp group).
double ulysses_step_bytes(const Config& c, int world) {
  const int u = c.parallel.cp;
  const double L = double(c.data.seq_len) / u, H = c.model.n_heads, D = c.model.head_dim();
  const double kv = std::max(1, c.model.n_kv_heads / u) * u;  // K/V heads over the group
  const double f = 4 * L * (2 * H * D + 2 * kv * D + H), b = 4 * L * (4 * H * D + 4 * kv * D + H);
  int moe_layers = 0;
  for (int l = 0; l < c.model.n_layers; ++l) moe_layers += c.model.is_moe_layer(l);
  const double sequences = double(c.data.num_microbatches * c.data.micro_batch_size);
  return world * sequences *
         (c.model.n_layers * (u - 1.0) / u * (f + b) + moe_layers * (c.model.n_experts + 1) * 8.0);
}

void check_case(Config cfg, int pp, int cp, CpMode mode, int u, CpLayout layout,
                TopologyOverride topo) {
  const int world = testing::world_size();
  cfg.parallel.pp = pp;
  cfg.parallel.cp = cp;
  cfg.parallel.cp_mode = mode;
  cfg.parallel.cp_ulysses = mode == CpMode::hybrid ? u : 0;
  cfg.parallel.cp_layout = layout;
  cfg.topology = topo;
  const int dp = world / (pp * cp);
  train::check_config(cfg, world);  // the rules a run applies accept the mesh
  Topology t = detect_topology(testing::world_comm(), cfg);
  auto c = build_communicators(testing::world_comm(), cfg, std::move(t));
  REQUIRE(c->mesh.cp_ulysses == (mode == CpMode::ring ? 1 : u));
  train::Trainer par_t(cfg, testing::train_comms(*c));
  const Curve par = testing::train_steps(par_t, cfg.train.steps);
  if (testing::world_rank() != 0) return;
  Config one = cfg;
  one.parallel.pp = one.parallel.cp = 1;
  one.parallel.cp_mode = CpMode::ring;
  one.parallel.cp_ulysses = 0;
  one.data.num_microbatches *= dp;
  one.topology.reset();
  train::Trainer ser_t(one, {});
  const Curve ser = testing::train_steps(ser_t, cfg.train.steps);
  for (size_t s = 0; s < ser.loss.size(); ++s) {
    std::printf(
        "pp=%d cp=%d %s u=%d %s dp=%d: step %zu loss %.7f (serial %.7f) norm %.6f "
        "(serial %.6f)\n",
        pp, cp, config_name(mode).c_str(), u, config_name(layout).c_str(), dp, s, par.loss[s],
        ser.loss[s], par.norm[s], ser.norm[s]);
    INFO("pp=" << pp << " cp=" << cp << " " << config_name(mode) << " u=" << u << " step " << s);
    REQUIRE(std::fabs(par.loss[s] - ser.loss[s]) <= 1e-4 * std::fabs(ser.loss[s]));
    REQUIRE(std::fabs(par.norm[s] - ser.norm[s]) <= 1e-4 * std::fabs(ser.norm[s]));
  }
  REQUIRE(ser.loss.back() < ser.loss.front());  // the run trained
  // The exchanges count as cp traffic, and pure Ulysses sends exactly its formula.
  for (double b : par.cp_bytes) CHECK(b > 0);
  if (mode == CpMode::ulysses)
    for (double b : par.cp_bytes) CHECK(b == Approx(ulysses_step_bytes(cfg, world)).epsilon(1e-12));
}

}  // namespace

TEST_CASE("ulysses cp4 x dp and hybrid cp4 (u=2) equal the one-rank run", "[parity][np4]") {
  REQUIRE(testing::world_size() == 4);
  check_case(tiny(), 1, 4, CpMode::ulysses, 4, CpLayout::zigzag, TopologyOverride{1, 4, 4});
  // cp4 = Ulysses 2 x ring 2: the ring crosses the NVLink domains of 2 ranks.
  check_case(tiny(), 1, 4, CpMode::hybrid, 2, CpLayout::contiguous, TopologyOverride{1, 4, 2});
}

TEST_CASE("pp2 x hybrid cp4 and hybrid cp8 across nodes equal the one-rank run", "[parity][np8]") {
  REQUIRE(testing::world_size() == 8);
  // pp2 x hybrid cp4 (u = 2, ring of 2 across domains of 2) x dp1
  check_case(tiny(), 2, 4, CpMode::hybrid, 2, CpLayout::zigzag, TopologyOverride{2, 4, 2});
  // hybrid cp8 = Ulysses 4 x ring 2 across two nodes; ulysses cp2 x dp4
  check_case(tiny(), 1, 8, CpMode::hybrid, 4, CpLayout::zigzag, TopologyOverride{2, 4, 4});
  check_case(tiny(), 1, 2, CpMode::ulysses, 2, CpLayout::zigzag, TopologyOverride{2, 4, 4});
}
