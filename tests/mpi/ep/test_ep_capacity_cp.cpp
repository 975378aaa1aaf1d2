// Capacity-limited routing does not depend on the cp split: with
// capacity_factor 0.75 and 1.0, cp = 2 and 4, zig-zag and contiguous
// layouts, the per-step losses of training equal the one-rank run's within
// 1e-6 relative over 8 steps. Capacity is decided over each micro-batch's
// whole sequences, as one rank holds them, whichever ranks hold their parts.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <map>

#include "mpi_test_util.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/trainer.hpp"

using namespace trident;

namespace {

Config capacity_model(double capacity_factor) {
  Config c;
  c.model.vocab_size = 32;
  c.model.d_model = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.ffn_hidden = 48;
  c.model.n_experts = 4;
  c.model.top_k = 2;
  c.model.capacity_factor = capacity_factor;
  c.data.task = DataTask::recall;
  c.data.seq_len = 32;
  c.data.micro_batch_size = 2;
  c.data.num_microbatches = 2;
  c.train.steps = 8;
  c.train.lr = 1e-2;
  c.train.warmup_steps = 1;
  c.runtime.timeout_s = 60;
  c.output.timeline = false;
  c.topology = TopologyOverride{1, testing::world_size(), testing::world_size()};
  return c;
}

std::vector<double> mesh_losses(const Config& cfg) {
  Topology topo = detect_topology(trident::testing::world_comm(), cfg);
  auto comms = build_communicators(trident::testing::world_comm(), cfg, std::move(topo));
  train::TrainComms tc{comms->world.get(), comms->pp.get(),   comms->cp.get(),
                       comms->ep.get(),    comms->dpcp.get(), comms->expert_replica.get(),
                       comms->me.pp,       comms->mesh.pp,    comms->me.dp,
                       comms->mesh.dp};
  train::Trainer t(cfg, tc);
  std::vector<double> loss;
  for (int s = 0; s < cfg.train.steps; ++s) loss.push_back(t.train_step(s).metrics.loss);
  return loss;
}

// The same global batch on one rank: dp x num_microbatches micro-batches.
std::vector<double> serial_losses(Config cfg, int dp) {
  cfg.parallel.cp = cfg.parallel.ep = 1;
  cfg.data.num_microbatches *= dp;
  train::Trainer t(cfg, {});
  std::vector<double> loss;
  for (int s = 0; s < cfg.train.steps; ++s) loss.push_back(t.train_step(s).metrics.loss);
  return loss;
}

void check_case(double capacity_factor, int cp, int ep, const char* layout) {
  const int world = testing::world_size(), dp = world / cp;
  Config cfg = capacity_model(capacity_factor);
  cfg.parallel.cp = cp;
  cfg.parallel.ep = ep;
  cfg.parallel.cp_layout = *parse_config_name<CpLayout>(layout);
  const std::vector<double> par = mesh_losses(cfg);
  if (testing::world_rank() != 0) return;
  const std::vector<double> ser = serial_losses(cfg, dp);
  // Capacity is active: the dropless run (one per dp, computed once) trains differently.
  static std::map<int, std::vector<double>> dropless;
  if (!dropless.count(dp)) dropless[dp] = serial_losses(capacity_model(0.0), dp);
  CHECK(std::fabs(dropless[dp][1] - ser[1]) > 1e-4 * std::fabs(ser[1]));
  for (size_t s = 0; s < ser.size(); ++s) {
    std::printf("capacity %.2f cp=%d ep=%d dp=%d %s: step %zu loss %.9f (one rank %.9f)\n",
                capacity_factor, cp, ep, dp, layout, s, par[s], ser[s]);
    INFO("capacity " << capacity_factor << " cp=" << cp << " ep=" << ep << " " << layout << " step "
                     << s);
    CHECK(std::fabs(par[s] - ser[s]) <= 1e-6 * std::fabs(ser[s]));
  }
}

}  // namespace

TEST_CASE("capacity drops with cp equal the one-rank run's, both layouts", "[ep][cp]") {
  REQUIRE(testing::world_size() == 4);
  for (double cf : {0.75, 1.0})
    for (const char* layout : {"zigzag", "contiguous"}) {
      check_case(cf, 2, 1, layout);  // dp = 2
      check_case(cf, 2, 2, layout);  // ep over the cp pair's and dp's ranks
      check_case(cf, 4, 1, layout);
    }
}
