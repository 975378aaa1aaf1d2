// The serial training loop: the loss falls on the recall task, and a run is a
// pure function of its config (two runs give identical losses).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "trident/train/trainer.hpp"

using namespace trident;

namespace {
Config small_recall() {
  Config c;
  c.model.vocab_size = 32;
  c.model.d_model = 32;
  c.model.n_layers = 2;
  c.model.n_heads = 4;
  c.model.n_kv_heads = 2;
  c.model.ffn_hidden = 64;
  c.model.n_experts = 4;
  c.data.task = DataTask::recall;
  c.data.seq_len = 64;
  c.data.micro_batch_size = 2;
  c.data.num_microbatches = 2;
  c.train.steps = 40;
  c.train.lr = 1e-2;
  c.train.warmup_steps = 3;
  return c;
}
}  // namespace

TEST_CASE("serial training: the recall loss falls by half", "[train]") {
  Config c = small_recall();
  train::Trainer t(c, {});
  std::vector<double> losses;
  for (int s = 0; s < c.train.steps; ++s) losses.push_back(t.train_step(s).metrics.loss);
  for (int s = 0; s < c.train.steps; s += 5) std::printf("step %d loss %.4f\n", s, losses[size_t(s)]);
  REQUIRE(std::isfinite(losses.back()));
  REQUIRE(losses.back() < 0.5 * losses.front());
}

TEST_CASE("serial training is deterministic", "[train]") {
  Config c = small_recall();
  c.train.steps = 3;
  train::Trainer a(c, {}), b(c, {});
  for (int s = 0; s < 3; ++s) {
    auto ra = a.train_step(s), rb = b.train_step(s);
    REQUIRE(ra.metrics.loss == rb.metrics.loss);
    REQUIRE(ra.metrics.grad_norm == rb.metrics.grad_norm);
    REQUIRE(ra.metrics.grad_norm > 0);
  }
}
