// Parallel equals serial for the whole training step: per-step losses and
// gradient norms of a distributed run equal the one-rank run's (same global
// batch: the reference runs dp x num_microbatches micro-batches) within 1e-4,
// and after one step every parameter's gradient equals the one-rank
// gradient within 1e-5 relative. 4 ranks: each parallelism alone, and the V
// schedules; 8 ranks: pp x cp x ep x dp together, under each pipeline
// schedule. The sharded optimizer (train.optimizer_sharding = "dp") equals
// the unsharded one on the same mesh bit for bit over 10 steps, holding its
// share of the moments. A test case tagged [npN] needs exactly N ranks: CMake runs it only
// in the npN registration, and it fails (not passes) anywhere else.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "tiny_config.hpp"
#include "train_steps.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/trainer.hpp"

using namespace trident;
using trident::testing::Curve;
using trident::testing::train_comms;

namespace {

// 4 layers, MoE every 2nd (dense and MoE layers both present); clipping
// at 0.5, small enough to clip: the global norm must be right.
Config tiny(int world) {
  Config c = testing::tiny_config({.layers = 4, .moe_every = 2}, {},
                                  {.steps = 4, .lr = 1e-2, .warmup = 1, .grad_clip = 0.5});
  c.train.weight_decay = 0.1;  // every mesh must decay the same parameters
  c.topology = TopologyOverride{1, world, world};
  return testing::test_run_settings(c);
}

Curve run_mesh(const Config& cfg) {
  Topology topo = detect_topology(trident::testing::world_comm(), cfg);
  auto comms = build_communicators(trident::testing::world_comm(), cfg, std::move(topo));
  train::Trainer t(cfg, train_comms(*comms));
  return testing::train_steps(t, cfg.train.steps);
}

// The one-rank run of the same global batch.
Config serial_config(Config cfg, int dp) {
  cfg.parallel.pp = cfg.parallel.cp = cfg.parallel.ep = cfg.parallel.vpp = 1;
  cfg.parallel.schedule = PipelineSchedule::one_f_one_b;
  cfg.data.num_microbatches *= dp;
  return cfg;
}

Curve run_serial(Config cfg, int dp) {
  train::Trainer t(serial_config(cfg, dp), {});
  return testing::train_steps(t, cfg.train.steps);
}

void check_case(int pp, int cp, int ep, const std::string& schedule, int vpp = 1, int n_layers = 4,
                int microbatches = 4, EpTransportChoice transport = EpTransportChoice::automatic) {
  const int world = testing::world_size();
  Config cfg = tiny(world);
  cfg.runtime.ep_transport = transport;
  cfg.model.n_layers = n_layers;
  cfg.data.num_microbatches = microbatches;
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
    std::printf(
        "pp=%d cp=%d ep=%d dp=%d %s: step %zu loss %.7f (serial %.7f) grad norm %.6f (serial "
        "%.6f)\n",
        pp, cp, ep, dp, schedule.c_str(), s, par.loss[s], ser.loss[s], par.norm[s], ser.norm[s]);
    INFO("pp=" << pp << " cp=" << cp << " ep=" << ep << " dp=" << dp << " " << schedule << " step "
               << s);
    REQUIRE(std::fabs(par.loss[s] - ser.loss[s]) <= 1e-4 * std::fabs(ser.loss[s]));
    REQUIRE(std::fabs(par.norm[s] - ser.norm[s]) <= 1e-4 * std::fabs(ser.norm[s]));
  }
  // the run trained: the loss moved
  REQUIRE(ser.loss.back() < ser.loss.front());
}

}  // namespace

TEST_CASE("each parallelism alone equals the one-rank run", "[parity][np4]") {
  REQUIRE(testing::world_size() == 4);
  check_case(1, 1, 1, "1f1b");  // dp = 4
  check_case(1, 4, 1, "1f1b");  // cp = 4
  check_case(1, 1, 4, "1f1b");  // ep = 4 (over dp = 4)
  check_case(4, 1, 1, "1f1b");  // pp = 4
}

TEST_CASE("the V schedules (stages r and 2p-1-r on rank r) equal the one-rank run",
          "[parity][np4]") {
  REQUIRE(testing::world_size() == 4);
  check_case(4, 1, 1, "zb-v", 2, 8, 5);
  check_case(4, 1, 1, "dualpipev", 2, 8, 8);
  check_case(2, 2, 1, "zb-v", 2, 4, 3);  // with cp, dp = 1
  // With ep over dp = 2, on the shm transport ("auto" on one node): one
  // layer per stage, so a rank runs the same layer's backwards back to back
  // with no count exchange in between (test_ep_dispatch's "shm: a dispatch leaves
  // alone the rows peers still read" is the race this once hit, 1 run in 10).
  check_case(2, 1, 2, "dualpipev", 2, 4, 4);
}

TEST_CASE("pp x cp x ep x dp together equals the one-rank run", "[parity][np8]") {
  REQUIRE(testing::world_size() == 8);
  check_case(2, 2, 2, "1f1b");
  check_case(2, 2, 2, "zb-h1");
  check_case(2, 2, 2, "interleaved", 2);
  check_case(2, 2, 2, "afab");
  check_case(2, 2, 2, "zb-v", 2, 4, 4, EpTransportChoice::alltoallv);  // both transports
  check_case(2, 2, 2, "dualpipev", 2, 4, 4);
}

namespace {

// After one step on the mesh, every parameter this rank holds has the
// gradient the one-rank run has for it (after the dp/cp/expert reductions,
// before clipping, which the optimizer applies as a scale). Returns the
// indices, in the one-rank run's parameter order, of the parameters checked.
std::vector<int> check_gradients(const Config& cfg, int dp) {
  Topology topo = detect_topology(trident::testing::world_comm(), cfg);
  auto comms = build_communicators(trident::testing::world_comm(), cfg, std::move(topo));
  train::Trainer mesh(cfg, train_comms(*comms));
  mesh.train_step(0);
  train::Trainer serial(serial_config(cfg, dp), {});
  serial.train_step(0);
  std::map<std::string, int> index;
  const std::vector<Param*> ref = serial.stage().params();
  for (size_t i = 0; i < ref.size(); ++i) index[ref[i]->name] = int(i);
  std::vector<int> seen;
  for (Param* p : mesh.stage().params()) {
    INFO("rank " << testing::world_rank() << " parameter " << p->name);
    auto it = index.find(p->name);
    REQUIRE(it != index.end());
    const Param& r = *ref[size_t(it->second)];
    REQUIRE(p->grad.shape() == r.grad.shape());
    double scale = 0;
    for (int64_t i = 0; i < r.grad.numel(); ++i)
      scale = std::max(scale, double(std::fabs(r.grad[i])));
    const double rel_l2 = rel_l2_diff(p->grad, r.grad);
    const double worst = max_rel_diff(p->grad, r.grad, std::max(scale, 1e-30));
    INFO("rel L2 " << rel_l2 << ", largest difference / largest |g| " << worst << ", |g|max "
                   << scale);
    CHECK(rel_l2 <= 1e-5);
    CHECK(worst <= 1e-5);
    seen.push_back(it->second);
  }
  return seen;
}

// Together the ranks hold every parameter of the one-rank model (`seen`:
// this rank's, from check_gradients).
void check_every_parameter_held(const Config& cfg, int dp, const std::vector<int>& seen) {
  const size_t n_params = train::Trainer(serial_config(cfg, dp), {}).stage().params().size();
  std::vector<int> held(n_params, 0);
  for (int i : seen) held[size_t(i)] = 1;
  MPI_Allreduce(MPI_IN_PLACE, held.data(), int(held.size()), MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  for (size_t i = 0; i < held.size(); ++i) {
    INFO("one-rank parameter " << i << " is on no rank");
    CHECK(held[i] == 1);
  }
}

}  // namespace

TEST_CASE("every parameter's gradient after one step equals the one-rank gradient",
          "[parity][np8]") {
  REQUIRE(testing::world_size() == 8);
  for (const std::string schedule : {"1f1b", "zb-h1", "zb-v", "dualpipev"}) {
    INFO("schedule " << schedule);
    Config cfg = tiny(8);
    cfg.parallel.pp = cfg.parallel.cp = cfg.parallel.ep = 2;  // dp = 2
    cfg.parallel.schedule = *parse_config_name<PipelineSchedule>(schedule);
    if (schedule == "zb-v" || schedule == "dualpipev") {
      cfg.parallel.vpp = 2;  // the V placement: stages r and 3-r on rank r
      if (schedule == "zb-v") cfg.runtime.ep_transport = EpTransportChoice::alltoallv;
    }
    check_every_parameter_held(cfg, 2, check_gradients(cfg, 2));
  }
}

TEST_CASE("the pre-trained architecture keys on pp x cp x ep x dp equal the one-rank run",
          "[parity][np8]") {
  REQUIRE(testing::world_size() == 8);
  for (const std::string schedule : {"1f1b", "zb-v"}) {
    INFO("schedule " << schedule);
    Config cfg = tiny(8);
    cfg.model.head_dim_key = 6;  // 4 heads of 6 on d_model 32
    cfg.model.qk_norm = true;
    cfg.model.moe_ffn_hidden = 20;
    cfg.model.moe_every = 1;
    cfg.model.dense_layers = {2};
    cfg.model.norm_eps = 1e-6;
    cfg.model.rope_scaling = RopeScaling::llama3;
    cfg.model.rope_factor = 8.0;
    cfg.model.rope_original_max_positions = 40;
    cfg.model.rope_theta = 100.0;
    cfg.parallel.pp = cfg.parallel.cp = cfg.parallel.ep = 2;  // dp = 2
    cfg.parallel.schedule = *parse_config_name<PipelineSchedule>(schedule);
    if (schedule == "zb-v") {
      cfg.parallel.vpp = 2;  // rank 0 holds the first and the last stage: tied embeddings
      cfg.model.tie_embeddings = true;
    }
    check_every_parameter_held(cfg, 2, check_gradients(cfg, 2));
  }
}

TEST_CASE("every parameter's gradient under the V schedules at pp = 4", "[parity][np4]") {
  REQUIRE(testing::world_size() == 4);
  for (const std::string schedule : {"zb-v", "dualpipev"}) {
    INFO("schedule " << schedule);
    Config cfg = tiny(4);
    cfg.model.n_layers = 8;  // one layer per virtual stage
    cfg.data.num_microbatches = 8;
    cfg.parallel.pp = 4;
    cfg.parallel.vpp = 2;
    cfg.parallel.schedule = *parse_config_name<PipelineSchedule>(schedule);
    check_every_parameter_held(cfg, 1, check_gradients(cfg, 1));
  }
}

namespace {

// A run of cfg.train.steps steps on the mesh: its curve, this rank's
// parameters afterwards, and the optimizer state it held.
struct Trained {
  Curve curve;
  std::map<std::string, std::vector<float>> values;
  int64_t moments = 0;            // elements of AdamW's m on this rank
  int64_t dense = 0, expert = 0;  // this rank's parameter elements by reduction kind
};

Trained train_mesh(const Config& cfg) {
  Topology topo = detect_topology(trident::testing::world_comm(), cfg);
  auto comms = build_communicators(trident::testing::world_comm(), cfg, std::move(topo));
  train::Trainer t(cfg, train_comms(*comms));
  Trained out;
  out.curve = testing::train_steps(t, cfg.train.steps);
  for (Param* p : t.stage().params()) {
    out.values[p->name].assign(p->value.values().begin(), p->value.values().end());
    (p->reduce == GradReduce::expert ? out.expert : out.dense) += p->value.numel();
  }
  out.moments = t.optimizer().m().numel();
  return out;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// train.optimizer_sharding = "dp" against "none" on the same mesh over 10
// steps: losses, gradient norms and every parameter bit for bit (rank-ordered
// gradient sums, the norm over the same parts, the same AdamW calls; see
// share/trident/memory.md),
// and each rank holding 1/(dp*cp) of the dense and 1/replicas of the expert
// moments. Prints the largest relative differences when they are not.
void check_sharded(int pp, int cp, int ep, const std::string& schedule, int vpp = 1) {
  const int world = testing::world_size();
  Config cfg = tiny(world);
  cfg.train.steps = 10;
  cfg.parallel.pp = pp;
  cfg.parallel.cp = cp;
  cfg.parallel.ep = ep;
  cfg.parallel.vpp = vpp;
  cfg.parallel.schedule = *parse_config_name<PipelineSchedule>(schedule);
  const int dpcp = world / pp, replicas = dpcp / ep;
  cfg.train.optimizer_sharding = OptimizerSharding::none;
  const Trained plain = train_mesh(cfg);
  cfg.train.optimizer_sharding = OptimizerSharding::dp;
  const Trained sharded = train_mesh(cfg);
  INFO("pp=" << pp << " cp=" << cp << " ep=" << ep << " dp=" << dpcp / cp << " " << schedule
             << " rank " << testing::world_rank());
  for (size_t s = 0; s < plain.curve.loss.size(); ++s) {
    INFO("step " << s);
    const double l0 = plain.curve.loss[s], l1 = sharded.curve.loss[s];
    const double n0 = plain.curve.norm[s], n1 = sharded.curve.norm[s];
    INFO("relative differences: loss " << std::fabs(l1 - l0) / std::fabs(l0) << ", norm "
                                       << std::fabs(n1 - n0) / std::fabs(n0));
    REQUIRE(l1 == l0);
    REQUIRE(n1 == n0);
  }
  REQUIRE(plain.values.size() == sharded.values.size());
  for (const auto& [name, a] : plain.values) {
    INFO("parameter " << name);
    const std::vector<float>& b = sharded.values.at(name);
    REQUIRE(a.size() == b.size());
    INFO("relative L2 difference " << rel_l2_diff(b.data(), a.data(), int64_t(a.size())));
    REQUIRE(a == b);
  }
  REQUIRE(plain.moments == plain.dense + plain.expert);
  REQUIRE(sharded.moments == ceil_div(plain.dense, dpcp) + ceil_div(plain.expert, replicas));
  if (testing::world_rank() == 0)
    std::printf(
        "sharded optimizer pp=%d cp=%d ep=%d dp=%d %s: 10 steps; losses, gradient norms and "
        "parameters bit for bit equal to the unsharded run's (rank 0); rank 0 holds %lld of "
        "%lld moment elements\n",
        pp, cp, ep, dpcp / cp, schedule.c_str(), static_cast<long long>(sharded.moments),
        static_cast<long long>(plain.moments));
}

}  // namespace

TEST_CASE("the sharded optimizer (ZeRO-1) equals the unsharded one", "[parity][np4]") {
  REQUIRE(testing::world_size() == 4);
  check_sharded(1, 1, 1, "1f1b");  // dense and experts over dp = 4
  check_sharded(1, 2, 2, "1f1b");  // dense over cp x dp = 4, experts over 2 replicas
  // pp = 2: dense over dp = 2, experts unreplicated; a B/W split on the shm
  // transport.
  check_sharded(2, 1, 2, "zb-h1");
}

TEST_CASE("the sharded optimizer on pp x cp x ep x dp", "[parity][np8]") {
  REQUIRE(testing::world_size() == 8);
  check_sharded(2, 2, 2, "1f1b");
  check_sharded(2, 2, 2, "interleaved", 2);
}
