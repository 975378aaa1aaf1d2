// The planner's context-parallel modes: the cost model's bytes and FLOPs for
// ring, ulysses and hybrid equal planner.md's formulas evaluated by hand, the
// prediction exposes the all-to-alls whole and hides the ring behind the
// attention, and the search tries every mode and Ulysses size the mapping
// rules allow (hybrid past an NVLink domain, never ring or ulysses).
#include <catch2/catch.hpp>
#include <set>

#include "tiny_config.hpp"
#include "trident/plan/cost_model.hpp"
#include "trident/plan/predict.hpp"
#include "trident/plan/search.hpp"

using namespace trident;
using namespace trident::plan;

namespace {

// d=32, H=4, Hkv=2, D=8, 2 dense layers, seq 64, one sequence per micro-batch.
Config small() { return testing::tiny_config({.ffn = 32, .experts = 0}, {.seq_len = 64}); }

MeshPlan plan_of(int cp, CpMode mode, int u) {
  MeshPlan p;
  p.cp = cp, p.dp = 1, p.micro_batch_size = 1, p.microbatches = 4;
  p.cp_mode = mode, p.cp_ulysses = u;
  return p;
}

MachineProfile machine() {
  MachineProfile m;
  m.name = "unit";
  m.gemm_flops = 1e9;
  m.attention_flops = 5e8;
  m.memory_Bps = 2e9;
  m.nvlink = Link{1e9, 1e-6};
  m.node = Link{1e8, 1e-5};
  m.network = Link{1e7, 1e-4};
  return m;
}

}  // namespace

TEST_CASE("cp modes: bytes and attention FLOPs by hand") {
  const Config c = small();
  const double L = 64 / 4.0;  // tokens per rank at cp = 4
  SECTION("ring cp=4") {
    const ChunkCost r = chunk_cost(c, plan_of(4, CpMode::ring, 1), 0);
    CHECK(r.f_comm.cp_bytes == 2 * 3 * (4 * 2 * L * 2 * 8));  // layers x (cp-1) x K/V block
    CHECK(r.f_comm.a2a_bytes == 0);
    CHECK(r.f_comm.a2a_calls == 0);
  }
  SECTION("ulysses cp=4: no ring; H/u = 1 head, Hkv < u: one K/V head per rank") {
    const ChunkCost u = chunk_cost(c, plan_of(4, CpMode::ulysses, 4), 0);
    CHECK(u.f_comm.cp_bytes == 0);
    CHECK(u.f_comm.cp_steps == 0);
    // per layer: 3/4 of 4 L (2 H D + 2 u h D + H), h = 1
    const double f = 0.75 * 4 * L * (2 * 4 * 8 + 2 * 4 * 1 * 8 + 4);
    const double b = 0.75 * 4 * L * (4 * 4 * 8 + 4 * 4 * 1 * 8 + 4);
    CHECK(u.f_comm.a2a_bytes == Approx(2 * f));
    CHECK(u.b_comm.a2a_bytes == Approx(2 * b));
    CHECK(u.f_comm.a2a_calls == 2 * 5);
    CHECK(u.b_comm.a2a_calls == 2 * 9);
    // the whole causal attention over 1/u of the heads: S(S+1)/2 pairs x 4 (H/u) D
    CHECK(u.f.attention_flops == Approx(2 * (64.0 * 65 / 2) * 4 * 1 * 8));
  }
  SECTION("hybrid cp=4 u=2: ring of 2 over blocks of 2L tokens, 1 K/V head") {
    const ChunkCost h = chunk_cost(c, plan_of(4, CpMode::hybrid, 2), 0);
    CHECK(h.f_comm.cp_bytes == 2 * 1 * (4 * 2 * (2 * L) * 1 * 8));
    CHECK(h.f_comm.cp_steps == 2 * 1);
    const double f = 0.5 * 4 * L * (2 * 4 * 8 + 2 * 2 * 1 * 8 + 4);
    CHECK(h.f_comm.a2a_bytes == Approx(2 * f));
    // zig-zag ring of 2: 1/2 of the pairs for H/u = 2 heads
    CHECK(h.f.attention_flops == Approx(2 * (64.0 * 65 / 2 / 2) * 4 * 2 * 8));
  }
}

TEST_CASE("cp modes: the all-to-alls are exposed whole, the ring only beyond the compute") {
  Config c = small();
  const ClusterShape shape{1, 4, 4};
  const MachineProfile m = machine();
  const Prediction u = predict(c, plan_of(4, CpMode::ulysses, 4), shape, m);
  const ChunkCost cu = chunk_cost(c, plan_of(4, CpMode::ulysses, 4), 0);
  const double a2a = (cu.f_comm.a2a_calls + cu.b_comm.a2a_calls) * 3 * m.nvlink.latency_s +
                     (cu.f_comm.a2a_bytes + cu.b_comm.a2a_bytes) / m.nvlink.bandwidth_Bps;
  CHECK(u.split.cp == Approx(c.data.num_microbatches * a2a));
  // A ring whose blocks are small against each step's attention is hidden
  // but for the last dK/dV block's trip home (1e-15 s per byte here).
  MachineProfile fast = m;
  fast.nvlink = Link{1e15, 0};
  const ChunkCost cr = chunk_cost(c, plan_of(4, CpMode::ring, 1), 0);
  CHECK(cr.b_comm.cp_tail_bytes > 0);
  CHECK(predict(c, plan_of(4, CpMode::ring, 1), shape, fast).split.cp ==
        Approx(c.data.num_microbatches * cr.b_comm.cp_tail_bytes / 1e15));
  CHECK(predict(c, plan_of(4, CpMode::ulysses, 4), shape, fast).split.cp > 0);
}

TEST_CASE("cp modes: each ring step and all-to-all adds the profile's exchange cost") {
  Config c = small();
  const ClusterShape shape{1, 4, 4};
  MachineProfile m = machine();
  m.nvlink = Link{1e15, 0};  // bytes free: only the exchange costs remain
  MachineProfile costly = m;
  costly.ring_step_s = 3e-5;
  costly.alltoall_s = 7e-5;
  const double mb = c.data.num_microbatches;
  SECTION("ring: every step of F and B, and the dK/dV trip home") {
    const MeshPlan p = plan_of(4, CpMode::ring, 1);
    const ChunkCost cr = chunk_cost(c, p, 0);
    const int steps = cr.f_comm.cp_steps + cr.b_comm.cp_steps + cr.b_comm.cp_tail_messages;
    CHECK(steps == 2 * 3 + 2 * 3 + 2);  // layers x (cp-1) in F and in B, one trip home each
    CHECK(predict(c, p, shape, costly).split.cp - predict(c, p, shape, m).split.cp ==
          Approx(mb * steps * 3e-5));
  }
  SECTION("ulysses: every all-to-all call") {
    const MeshPlan p = plan_of(4, CpMode::ulysses, 4);
    const ChunkCost cu = chunk_cost(c, p, 0);
    CHECK(predict(c, p, shape, costly).split.cp - predict(c, p, shape, m).split.cp ==
          Approx(mb * (cu.f_comm.a2a_calls + cu.b_comm.a2a_calls) * 7e-5));
  }
  SECTION("hybrid: both") {
    const MeshPlan p = plan_of(4, CpMode::hybrid, 2);
    const ChunkCost ch = chunk_cost(c, p, 0);
    const double ring = ch.f_comm.cp_steps + ch.b_comm.cp_steps + ch.b_comm.cp_tail_messages;
    const double calls = ch.f_comm.a2a_calls + ch.b_comm.a2a_calls;
    CHECK(predict(c, p, shape, costly).step_time_s - predict(c, p, shape, m).step_time_s ==
          Approx(mb * (ring * 3e-5 + calls * 7e-5)));
  }
}

TEST_CASE("the search tries every cp mode, and only hybrid past an NVLink domain") {
  Config c = small();
  c.data.num_microbatches = 8;
  const ClusterShape shape{2, 4, 2};  // domains of 2 ranks
  SearchOptions opt;
  opt.top_k = 1 << 20;
  const SearchResult r = search(c, shape, machine(), opt);
  std::set<std::pair<int, int>> hybrid;  // (cp, u)
  bool ring = false, ulysses = false;
  for (const Prediction& p : r.best) {
    INFO(p.plan.str());
    CHECK(plan_refusal(c, shape, p.plan).empty());
    if (p.plan.cp_mode == CpMode::ring && p.plan.cp > 1) ring = true;
    if (p.plan.cp_mode == CpMode::ulysses) ulysses = true;
    if (p.plan.cp_mode == CpMode::hybrid) hybrid.insert({p.plan.cp, p.plan.cp_ulysses});
    if (p.plan.cp_mode != CpMode::hybrid) CHECK(p.plan.cp <= 2);
  }
  CHECK(ring);
  CHECK(ulysses);
  // hybrid: u = 2 (the domain), ring of 2 and 4 across domains and nodes
  CHECK(hybrid == std::set<std::pair<int, int>>{{4, 2}, {8, 2}});
  // plan text and JSON name the mode
  for (const Prediction& p : r.best)
    if (p.plan.cp_mode == CpMode::hybrid) {
      CHECK(p.plan.str().find("hybrid u=2") != std::string::npos);
      CHECK(prediction_json(p).find("\"cp_mode\": \"hybrid\", \"cp_ulysses\": 2") !=
            std::string::npos);
      break;
    }
}
