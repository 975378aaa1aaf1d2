// Search: every mesh it proposes is one the mapping rules and the config
// rules accept and that fits the memory limit; with room for all, it lists
// exactly the legal fitting meshes in order; the pruned answer equals the
// exhaustive one; an impossible search is refused with one line.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>

#include "tiny_config.hpp"
#include "trident/core/error.hpp"
#include "trident/plan/search.hpp"

using namespace trident;
using namespace trident::plan;

namespace {

Config moe_config() {
  return testing::tiny_config(
      {.vocab = 64, .d_model = 64, .layers = 8, .ffn = 128, .experts = 8, .top_k = 2},
      {.seq_len = 256, .micro_batch = 2, .microbatches = 8});
}

MachineProfile gpu_like() {
  MachineProfile m;
  m.name = "test";
  m.gemm_flops = 4e14;
  m.attention_flops = 2e14;
  m.memory_Bps = 2e12;
  m.nvlink = Link{2e11, 3e-6};
  m.node = Link{5e10, 5e-6};
  m.network = Link{4e10, 1e-5};
  m.step_overhead_s = 1e-4;
  return m;
}

}  // namespace

TEST_CASE("with room for every mesh the search lists exactly the legal ones, fastest first") {
  const Config c = moe_config();
  const ClusterShape shape{2, 4, 2};
  SearchOptions opt;
  opt.top_k = 1 << 20;
  const SearchResult r = search(c, shape, gpu_like(), opt);
  CHECK(r.legal > 20);
  CHECK(r.refused_memory == 0);
  CHECK(long(r.best.size()) == r.legal);
  for (size_t i = 0; i < r.best.size(); ++i) {
    INFO(r.best[i].plan.str());
    CHECK(plan_refusal(c, shape, r.best[i].plan).empty());
    CHECK(r.best[i].plan.global_batch() == r.global_batch);
    if (i) CHECK(r.best[i - 1].step_time_s <= r.best[i].step_time_s * (1 + kStepTie));
    if (i && r.best[i - 1].step_time_s > r.best[i].step_time_s)  // a tie: less memory first
      CHECK(r.best[i - 1].memory.total() <= r.best[i].memory.total());
  }
  // every schedule family is among the candidates
  std::set<PipelineSchedule> seen;
  for (const Prediction& p : r.best) seen.insert(p.plan.schedule);
  CHECK(seen.size() == 6);
  // the pruned search finds the same best meshes
  opt.top_k = 3;
  const SearchResult pruned = search(c, shape, gpu_like(), opt);
  REQUIRE(pruned.best.size() == 3);
  CHECK(pruned.simulated < r.simulated);
  for (int i = 0; i < 3; ++i) {
    CHECK(pruned.best[i].step_time_s == Approx(r.best[i].step_time_s));
    CHECK(pruned.best[i].plan.str() == r.best[i].plan.str());
  }
}

TEST_CASE("the search never proposes a mesh the rules or the memory limit refuse") {
  const Config c = moe_config();
  for (ClusterShape shape : {ClusterShape{1, 8, 8}, ClusterShape{2, 4, 2}, ClusterShape{4, 2, 1}}) {
    SearchOptions all;
    all.top_k = 1 << 20;
    const SearchResult every = search(c, shape, gpu_like(), all);
    std::vector<double> mem;
    for (const Prediction& p : every.best) mem.push_back(p.memory.total());
    std::sort(mem.begin(), mem.end());
    SearchOptions opt = all;
    opt.memory_limit_bytes = mem[mem.size() / 2];  // half of them fit
    const SearchResult r = search(c, shape, gpu_like(), opt);
    CHECK(r.refused_memory > 0);
    CHECK(r.best.size() + size_t(r.refused_memory) == size_t(r.legal));
    for (const Prediction& p : r.best) {
      INFO(p.plan.str());
      CHECK(p.memory.total() <= opt.memory_limit_bytes);
      CHECK(plan_refusal(c, shape, p.plan).empty());
      const bool hybrid = p.plan.cp_mode == CpMode::hybrid;
      CHECK(check_mesh(
                shape,
                {p.plan.pp, p.plan.cp, p.plan.ep, p.plan.cp_mode, hybrid ? p.plan.cp_ulysses : 0},
                c.model.n_experts)
                .ok());
      // the all-to-all part always inside a domain; the whole cp group unless hybrid
      CHECK(shape.nvlink_domain % (hybrid ? p.plan.cp_ulysses : p.plan.cp) == 0);
    }
  }
  // a refused request stays refused: cp beyond the NVLink domain
  MeshPlan wide;
  wide.cp = 4, wide.dp = 2, wide.microbatches = 8, wide.micro_batch_size = 2;
  CHECK(plan_refusal(c, ClusterShape{2, 4, 2}, wide).find("NVLink domain") != std::string::npos);
}

TEST_CASE("an impossible search is refused with one line") {
  const Config c = moe_config();
  SearchOptions opt;
  opt.memory_limit_bytes = 1000;
  CHECK_THROWS_WITH(
      search(c, ClusterShape{1, 8, 8}, gpu_like(), opt),
      Catch::Matchers::StartsWith("--search: no legal mesh of 8 ranks fits --memory-gb 0.000"));
  opt.memory_limit_bytes = 0;
  // 3 sequences on 8 ranks: dp = 1, so pp*cp = 8 with pp <= 2 layers, and
  // cp >= 4 does not divide a 250-token sequence
  opt.global_batch = 3;
  Config odd = c;
  odd.data.seq_len = 250;
  odd.model.n_layers = 2;
  CHECK_THROWS_WITH(
      search(odd, ClusterShape{1, 8, 8}, gpu_like(), opt),
      Catch::Matchers::StartsWith("--search: no legal mesh of 8 ranks for a global batch of 3"));
}

TEST_CASE("tied predictions rank the calibrated shape first, then less memory") {
  // ranks that outnumber the cores: many meshes have the same work per core
  const Config c = moe_config();
  MachineProfile m = gpu_like();
  m.cores_per_node = 1;
  m.calibrated_tokens = double(c.data.micro_batch_size) * c.data.seq_len;
  SearchOptions opt;
  opt.top_k = 1 << 20;
  const SearchResult r = search(c, ClusterShape{1, 4, 4}, m, opt);
  auto distance = [&](const MeshPlan& p) {
    return std::abs(
        std::log(p.micro_batch_size * double(c.data.seq_len) / p.cp / m.calibrated_tokens));
  };
  // the first choice: nearest the calibrated shape among the predictions
  // tied with the fastest, and the least memory among those as near
  double fastest = r.best[0].step_time_s;
  for (const Prediction& p : r.best) fastest = std::min(fastest, p.step_time_s);
  int ties = 0;
  const Prediction& first = r.best[0];
  for (const Prediction& p : r.best) {
    if (p.step_time_s > fastest * (1 + kStepTie)) continue;
    ++ties;
    INFO(p.plan.str());
    CHECK(distance(first.plan) <= distance(p.plan));
    if (distance(first.plan) == distance(p.plan)) CHECK(first.memory.total() <= p.memory.total());
  }
  CHECK(ties > 1);
}

TEST_CASE("under a memory limit the search recomputes and shards, and says what each buys") {
  Config c = moe_config();
  c.data.seq_len = 1024;
  const ClusterShape shape{1, 4, 4};
  SearchOptions opt;
  opt.top_k = 1;
  const SearchResult free = search(c, shape, gpu_like(), opt);
  REQUIRE(free.best.size() == 1);
  CHECK(free.best[0].plan.recompute == Recompute::none);
  // the cheapest mesh without recompute, then a limit below it
  double least = 1e30;
  SearchOptions all = opt;
  all.top_k = 1 << 20;
  for (const Prediction& p : search(c, shape, gpu_like(), all).best)
    least = std::min(least, p.memory.total());
  opt.memory_limit_bytes = 0.9 * least;
  const SearchResult r = search(c, shape, gpu_like(), opt);
  REQUIRE(r.best.size() == 1);
  const Prediction& p = r.best[0];
  INFO(p.plan.str());
  CHECK(p.plan.recompute != Recompute::none);
  CHECK(p.memory.total() <= opt.memory_limit_bytes);
  CHECK(p.step_time_s >= free.best[0].step_time_s);
  REQUIRE(!p.policy_effects.empty());
  const PolicyEffect& rc = p.policy_effects.back();
  CHECK(rc.choice.rfind("recompute=", 0) == 0);
  CHECK(rc.memory_delta < 0);
  CHECK(rc.step_delta_s > 0);
  CHECK(!rc.fits_without);
  CHECK(p.baseline_memory > opt.memory_limit_bytes);
  CHECK(search_text(r, opt.memory_limit_bytes).find(rc.choice + ": saves") != std::string::npos);
  CHECK(search_json(r).find("\"policy_effects\": [") != std::string::npos);
}

TEST_CASE("a config's pp_layout is searched on its own pipeline; every other mesh splits evenly") {
  Config c = moe_config();
  c.parallel.pp = 2;
  const ClusterShape shape{2, 4, 2};
  SearchOptions opt;
  opt.top_k = 1 << 20;
  const SearchResult plain = search(c, shape, gpu_like(), opt);
  c.parallel.pp_layout = {3, 5};
  c.train.grad_bucket_mb = 4;
  const SearchResult laid = search(c, shape, gpu_like(), opt);
  // the layout refuses no mesh: the same legal meshes as without it
  CHECK(laid.legal == plain.legal);
  int with_layout = 0;
  for (const Prediction& p : laid.best) {
    INFO(p.plan.str());
    CHECK(plan_refusal(c, shape, p.plan).empty());
    CHECK(p.plan.grad_bucket_mb == 4);
    if (p.plan.pp == 2 && p.plan.vpp == 1) {
      CHECK(p.plan.pp_layout == std::vector<int>{3, 5});
      ++with_layout;
    } else {
      CHECK(p.plan.pp_layout.empty());
    }
  }
  CHECK(with_layout > 0);
}

TEST_CASE(
    "with packed documents the search also tries the docs layout, priced from the histogram") {
  Config c = moe_config();
  c.data.task = DataTask::tokens;
  c.data.token_file = "never-opened.bin";  // the search prices; it reads no data
  c.data.eod_token = 0;
  c.data.seq_len = 1024;
  // A long-tailed mix (bin b: lengths 2^b .. 2^(b+1) - 1), mean about seq/8.
  c.doc_lengths_log2 = {2, 4, 8, 12, 16, 16, 12, 8, 5, 3, 2};
  const ClusterShape shape{1, 8, 8};
  SearchOptions opt;
  opt.top_k = 1 << 20;
  const SearchResult causal = search(c, shape, gpu_like(), opt);
  for (const Prediction& p : causal.best) CHECK(p.plan.cp_layout != CpLayout::docs);
  c.data.packing = Packing::documents;
  const SearchResult packed = search(c, shape, gpu_like(), opt);
  // every zig-zag mesh on a plain ring of cp > 1 gains a docs twin, and no other
  auto twin = [](MeshPlan p) {
    p.cp_layout = CpLayout::zigzag;
    return p.str();
  };
  std::map<std::string, double> zigzag;
  for (const Prediction& p : packed.best)
    if (p.plan.cp_layout == CpLayout::zigzag) zigzag[p.plan.str()] = p.step_time_s;
  int docs = 0, faster = 0;
  for (const Prediction& p : packed.best) {
    if (p.plan.cp_layout != CpLayout::docs) continue;
    INFO(p.plan.str());
    ++docs;
    CHECK(plan_refusal(c, shape, p.plan).empty());
    CHECK(p.plan.cp_mode == CpMode::ring);
    CHECK(p.plan.cp > 1);
    REQUIRE(zigzag.count(twin(p.plan)) == 1);
    // the document layout's busiest rank carries fewer pairs than zig-zag's
    CHECK(p.step_time_s <= zigzag[twin(p.plan)] * (1 + 1e-12));
    if (p.step_time_s < zigzag[twin(p.plan)] * (1 - 1e-6)) ++faster;
  }
  CHECK(docs > 0);
  CHECK(faster > 0);
  int ring_zigzag = 0;
  for (const Prediction& p : packed.best)
    if (p.plan.cp_layout == CpLayout::zigzag && p.plan.cp_mode == CpMode::ring && p.plan.cp > 1)
      ++ring_zigzag;
  CHECK(docs == ring_zigzag);
  CHECK(packed.legal == causal.legal + docs);
}
