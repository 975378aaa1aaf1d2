// The transformer on one process: gradients against finite differences, the
// zero-bubble B/W split, and pipeline chunks chained by hand against the
// unsplit model.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <set>

#include "tiny_config.hpp"
#include "trident/core/error.hpp"
#include "trident/model/transformer.hpp"

using namespace trident;
using namespace trident::model;

namespace {

Config tiny(int n_experts) {
  Config c = testing::tiny_config(
      {.vocab = 20, .d_model = 16, .ffn = 24, .experts = n_experts},
      {.task = DataTask::copy, .seq_len = 12, .micro_batch = 2, .microbatches = 2});
  c.model.init_std = 0.3;  // large weights: gradients well above fp32 noise
  c.model.aux_loss_coef = 0.05;
  return c;
}

std::vector<MicroBatch> batches(const Config& c, int64_t step = 0) {
  auto data = make_data_source(c, 1);
  std::vector<int64_t> pos(size_t(c.data.seq_len));
  std::iota(pos.begin(), pos.end(), 0);
  return make_microbatches(*data, c.data, step, 0, pos);
}

// Runs every chunk of `stages` (pipeline order) on every micro-batch; returns
// the global loss (token mean + aux).
double run(std::vector<ModelStage*> stages, const Config& c, bool backward, bool split = false) {
  auto mbs = batches(c);
  const double n_tgt = double(c.data.micro_batch_size) * c.data.num_microbatches *
                       make_data_source(c, 1)->targets_per_sample();
  const double n_seq = double(c.data.micro_batch_size) * c.data.num_microbatches;
  for (ModelStage* s : stages) {
    s->begin_step(mbs, float(1.0 / n_tgt), float(1.0 / n_seq), nullptr);
    if (backward)
      for (Param* p : s->params()) p->grad.zero();
  }
  // virtual stage order: chunk c of stage r is c * pp + r
  std::vector<std::pair<ModelStage*, int>> order;
  const int pp = int(stages.size());
  for (int ch = 0; ch < stages[0]->n_chunks(); ++ch)
    for (int r = 0; r < pp; ++r) order.push_back({stages[size_t(r)], ch});
  for (int m = 0; m < int(mbs.size()); ++m) {
    // A stage may keep its input until the backward: a new buffer per hop.
    const int64_t n = stages[0]->boundary_numel(0, m);
    Tensor a;
    for (size_t i = 0; i < order.size(); ++i) {
      auto [s, ch] = order[i];
      Tensor b = i + 1 == order.size() ? Tensor() : Tensor({n});
      s->forward(ch, m, a, b);
      a = b;
    }
    if (!backward) continue;
    Tensor g;
    for (size_t i = order.size(); i-- > 0;) {
      auto [s, ch] = order[i];
      Tensor gi = i == 0 ? Tensor() : Tensor({n});
      s->backward(ch, m, g, gi, !split);
      g = gi;
    }
    if (split)
      for (auto [s, ch] : order) s->backward_weight(ch, m);
  }
  double loss = 0, aux = 0;
  for (ModelStage* s : stages) {
    loss += s->loss_sum();
    aux += s->aux_sum();
  }
  return loss / n_tgt + aux / n_seq;
}

std::map<std::string, Param*> by_name(std::vector<ModelStage*> stages) {
  std::map<std::string, Param*> m;
  for (ModelStage* s : stages)
    for (Param* p : s->params()) m[p->name] = p;
  return m;
}

void check_gradients(const Config& c) {
  ModelStage st(c, 0, 1, {});
  run({&st}, c, true);
  int checked = 0;
  for (Param* p : st.params()) {
    // the largest-gradient elements (clear of fp32 noise) and one more
    std::vector<int64_t> idx(size_t(p->grad.numel()));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(
        idx.begin(), idx.begin() + std::min<int64_t>(2, p->grad.numel()), idx.end(),
        [&](int64_t a, int64_t b) { return std::fabs(p->grad[a]) > std::fabs(p->grad[b]); });
    std::vector<int64_t> pick(idx.begin(), idx.begin() + std::min<int64_t>(2, p->grad.numel()));
    for (int64_t i : pick) {
      const float g = p->grad[i];
      const float v0 = p->value[i], h = 1e-3f;
      p->value[i] = v0 + h;
      const double fp = run({&st}, c, false);
      p->value[i] = v0 - h;
      const double fm = run({&st}, c, false);
      p->value[i] = v0;
      const double fd = (fp - fm) / (2.0 * h);
      INFO(p->name << "[" << i << "] analytic " << g << " finite-difference " << fd);
      REQUIRE(std::fabs(g - fd) <= 0.03 * std::fabs(fd) + 3e-4);
      ++checked;
    }
  }
  REQUIRE(checked > 20);
}

}  // namespace

TEST_CASE("dense model gradients match finite differences", "[model]") { check_gradients(tiny(0)); }

TEST_CASE("MoE model gradients match finite differences", "[model]") { check_gradients(tiny(4)); }

namespace {

// The keys of the pre-trained architectures (models.md) away from their
// defaults: heads wider than d_model / n_heads, q/k head norms, experts of
// their own hidden size, a dense layer among MoE layers, Llama 3 RoPE
// scaling, another epsilon, and one table for the embedding and the head.
Config pretrained_features() {
  Config c = tiny(4);
  c.model.head_dim_key = 6;  // 4 heads of 6 on d_model 16
  c.model.qk_norm = true;
  c.model.moe_ffn_hidden = 10;
  c.model.n_layers = 3;
  c.model.dense_layers = {1};
  c.model.norm_eps = 1e-6;
  c.model.rope_scaling = RopeScaling::llama3;
  c.model.rope_factor = 4.0;
  c.model.rope_original_max_positions = 16;  // every band within 12 positions
  c.model.rope_theta = 50.0;
  c.model.tie_embeddings = true;
  return c;
}

}  // namespace

TEST_CASE("pre-trained architecture keys: gradients match finite differences", "[model]") {
  const Config c = pretrained_features();
  ModelStage st(c, 0, 1, {});
  std::set<std::string> names;
  for (Param* p : st.params()) names.insert(p->name);
  CHECK(names.count("embedding") == 1);
  CHECK(names.count("lm_head") == 0);  // tied: the embedding is the head
  CHECK(names.count("layers.0.attn.q_norm") == 1);
  CHECK(names.count("layers.2.attn.k_norm") == 1);
  CHECK(names.count("layers.1.ffn.w_gate") == 1);          // dense_layers
  CHECK(names.count("layers.2.moe.experts.3.w_up") == 1);  // moe_every = 1
  for (Param* p : st.params()) {
    if (p->name == "layers.0.attn.wq") CHECK(p->value.shape() == std::vector<int64_t>{24, 16});
    if (p->name == "layers.0.attn.wo") CHECK(p->value.shape() == std::vector<int64_t>{16, 24});
    if (p->name == "layers.0.moe.experts.0.w_down")
      CHECK(p->value.shape() == std::vector<int64_t>{16, 10});
    if (p->name == "layers.0.attn.q_norm") CHECK(p->value.shape() == std::vector<int64_t>{6});
  }
  check_gradients(c);
}

TEST_CASE("the RoPE scaling changes the model's output", "[model]") {
  Config a = pretrained_features();
  a.model.rope_scaling = RopeScaling::none;
  Config b = a;
  b.model.rope_scaling = RopeScaling::linear;
  b.model.rope_factor = 2.0;
  ModelStage sa(a, 0, 1, {}), sb(b, 0, 1, {});
  const double la = run({&sa}, a, false), lb = run({&sb}, b, false);
  INFO("loss none " << la << ", linear x2 " << lb);
  CHECK(std::fabs(la - lb) > 1e-6 * std::fabs(la));
}

TEST_CASE("zero-bubble split (B then W) gives the same gradients as one backward", "[model]") {
  Config c = tiny(4);
  ModelStage a(c, 0, 1, {}), b(c, 0, 1, {});
  const double la = run({&a}, c, true, false);
  const double lb = run({&b}, c, true, true);
  REQUIRE(la == lb);
  auto pa = by_name({&a}), pb = by_name({&b});
  for (auto& [name, p] : pa) {
    INFO(name);
    REQUIRE(max_rel_diff(pb[name]->grad, p->grad, 1e-6) < 1e-5);
  }
}

TEST_CASE("pipeline chunks chained by hand equal the unsplit model", "[model]") {
  Config c = tiny(4);
  c.model.n_layers = 4;
  ModelStage whole(c, 0, 1, {});
  const double lw = run({&whole}, c, true);
  Config ci = c;
  ci.parallel.vpp = 2;  // 2 ranks x 2 chunks = 4 virtual stages
  ModelStage r0(ci, 0, 2, {}), r1(ci, 1, 2, {});
  REQUIRE(r0.is_first(0));
  REQUIRE(r1.is_last(1));
  const double lp = run({&r0, &r1}, ci, true);
  REQUIRE(std::fabs(lp - lw) <= 1e-5 * std::fabs(lw));
  auto pw = by_name({&whole}), pp = by_name({&r0, &r1});
  REQUIRE(pw.size() == pp.size());
  for (auto& [name, p] : pw) {
    INFO(name);
    REQUIRE(max_rel_diff(pp[name]->value, p->value) == 0.0);
    REQUIRE(rel_l2_diff(pp[name]->grad, p->grad) < 1e-5);
  }
}

TEST_CASE("too few layers for the pipeline is an input error", "[model]") {
  Config c = tiny(0);
  c.parallel.vpp = 2;
  REQUIRE_THROWS_AS(ModelStage(c, 0, 2, {}), InputError);
}
