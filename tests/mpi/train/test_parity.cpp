// Parallel equals serial for the whole training step: per-step losses and
// gradient norms of a distributed run equal the one-rank run's (same global
// batch: the reference runs dp x num_microbatches micro-batches) within 1e-4.
// 4 ranks: each parallelism alone; 8 ranks: pp x cp x ep x dp together, under
// each pipeline schedule.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "mpi_test_util.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/trainer.hpp"

using namespace trident;

namespace {

Config tiny(int world) {
  Config c;
  c.model.vocab_size = 32;
  c.model.d_model = 32;
  c.model.n_layers = 4;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.ffn_hidden = 48;
  c.model.n_experts = 4;
  c.model.top_k = 2;
  c.model.moe_every = 2;  // dense and MoE layers both present
  c.data.task = DataTask::recall;
  c.data.seq_len = 32;
  c.data.micro_batch_size = 1;
  c.data.num_microbatches = 4;
  c.train.steps = 4;
  c.train.lr = 1e-2;
  c.train.warmup_steps = 1;
  c.train.grad_clip = 0.5;  // small enough to clip: the global norm must be right
  c.runtime.timeout_s = 60;
  c.output.timeline = false;
  c.topology = TopologyOverride{1, world, world};
  return c;
}

struct Curve {
  std::vector<double> loss, norm;
};

Curve run_mesh(const Config& cfg) {
  Topology topo = detect_topology(trident::testing::world_comm(), cfg);
  auto comms = build_communicators(trident::testing::world_comm(), cfg, std::move(topo));
  train::TrainComms tc{comms->world.get(), comms->pp.get(), comms->cp.get(), comms->ep.get(),
                       comms->dpcp.get(), comms->expert_replica.get(), comms->me.pp, comms->mesh.pp,
                       comms->me.dp, comms->mesh.dp};
  train::Trainer t(cfg, tc);
  Curve c;
  for (int s = 0; s < cfg.train.steps; ++s) {
    auto r = t.train_step(s);
    c.loss.push_back(r.metrics.loss);
    c.norm.push_back(r.metrics.grad_norm);
  }
  return c;
}

Curve run_serial(Config cfg, int dp) {
  cfg.parallel.pp = cfg.parallel.cp = cfg.parallel.ep = cfg.parallel.vpp = 1;
  cfg.parallel.schedule = PipelineSchedule::one_f_one_b;
  cfg.data.num_microbatches *= dp;
  train::Trainer t(cfg, {});
  Curve c;
  for (int s = 0; s < cfg.train.steps; ++s) {
    auto r = t.train_step(s);
    c.loss.push_back(r.metrics.loss);
    c.norm.push_back(r.metrics.grad_norm);
  }
  return c;
}

void check_case(int pp, int cp, int ep, const std::string& schedule, int vpp = 1) {
  const int world = testing::world_size();
  Config cfg = tiny(world);
  cfg.parallel.pp = pp;
  cfg.parallel.cp = cp;
  cfg.parallel.ep = ep;
  cfg.parallel.vpp = vpp;
  cfg.parallel.schedule = *parse_config_name<PipelineSchedule>(schedule);
  const int dp = world / (pp * cp);
  Curve par = run_mesh(cfg);
  if (testing::world_rank() != 0) return;
  Curve ser = run_serial(cfg, dp);
  for (size_t s = 0; s < ser.loss.size(); ++s) {
    std::printf("pp=%d cp=%d ep=%d dp=%d %s: step %zu loss %.7f (serial %.7f) grad norm %.6f (serial %.6f)\n",
                pp, cp, ep, dp, schedule.c_str(), s, par.loss[s], ser.loss[s], par.norm[s], ser.norm[s]);
    INFO("pp=" << pp << " cp=" << cp << " ep=" << ep << " dp=" << dp << " " << schedule << " step " << s);
    REQUIRE(std::fabs(par.loss[s] - ser.loss[s]) <= 1e-4 * std::fabs(ser.loss[s]));
    REQUIRE(std::fabs(par.norm[s] - ser.norm[s]) <= 1e-4 * std::fabs(ser.norm[s]));
  }
  // the run trained: the loss moved
  REQUIRE(ser.loss.back() < ser.loss.front());
}

}  // namespace

TEST_CASE("each parallelism alone equals the one-rank run", "[parity]") {
  if (testing::world_size() != 4) return;
  check_case(1, 1, 1, "1f1b");  // dp = 4
  check_case(1, 4, 1, "1f1b");  // cp = 4
  check_case(1, 1, 4, "1f1b");  // ep = 4 (over dp = 4)
  check_case(4, 1, 1, "1f1b");  // pp = 4
}

TEST_CASE("pp x cp x ep x dp together equals the one-rank run", "[parity]") {
  if (testing::world_size() != 8) return;
  check_case(2, 2, 2, "1f1b");
  check_case(2, 2, 2, "zb-h1");
  check_case(2, 2, 2, "interleaved", 2);
  check_case(2, 2, 2, "afab");
}
