// The trainer on one process (src/train): the loss falls on the recall task,
// a run is a pure function of its config (two runs give identical losses),
// and the learning-rate schedule at hand-computed points.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>

#include "tiny_config.hpp"
#include "train_steps.hpp"
#include "trident/train/optimizer.hpp"
#include "trident/train/trainer.hpp"

using namespace trident;

namespace {
Config small_recall() {
  return testing::tiny_config({.ffn = 64}, {.seq_len = 64, .micro_batch = 2, .microbatches = 2},
                              {.steps = 40, .lr = 1e-2, .warmup = 3});
}
}  // namespace

TEST_CASE("serial training: the recall loss falls by half", "[train]") {
  Config c = small_recall();
  train::Trainer t(c, {});
  const std::vector<double> losses = testing::train_steps(t, c.train.steps).loss;
  for (int s = 0; s < c.train.steps; s += 5)
    std::printf("step %d loss %.4f\n", s, losses[size_t(s)]);
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

// The schedule at points worked out by hand: linear warm-up to lr over
// warmup_steps steps (step s uses lr * (s + 1) / warmup), then a half cosine
// from lr at the end of the warm-up to lr * min_lr_ratio at the last step,
// held at that floor afterwards.
TEST_CASE("learning rate: warm-up, its end, mid-cosine and the floor", "[train][lr]") {
  TrainConfig t;
  t.lr = 1e-3;
  t.min_lr_ratio = 0.1;
  t.warmup_steps = 10;
  t.steps = 110;  // 100 cosine steps
  auto lr = [&](int64_t s) { return train::learning_rate(t, s); };
  CHECK(lr(0) == Approx(1e-4).epsilon(1e-12));
  CHECK(lr(4) == Approx(5e-4).epsilon(1e-12));
  CHECK(lr(9) == Approx(1e-3).epsilon(1e-12));   // the warm-up's last step
  CHECK(lr(10) == Approx(1e-3).epsilon(1e-12));  // the cosine's first step
  // A quarter of the way: lo + (lr - lo) * (1 + cos(pi / 4)) / 2.
  CHECK(lr(35) == Approx(1e-4 + 9e-4 * 0.5 * (1.0 + std::sqrt(0.5))).epsilon(1e-12));
  CHECK(lr(60) == Approx(5.5e-4).epsilon(1e-12));  // half way: the mean of lr and lo
  CHECK(lr(85) == Approx(1e-4 + 9e-4 * 0.5 * (1.0 - std::sqrt(0.5))).epsilon(1e-12));
  CHECK(lr(110) == Approx(1e-4).epsilon(1e-12));  // the floor
  CHECK(lr(500) == Approx(1e-4).epsilon(1e-12));  // and held after the last step
  // No warm-up: the cosine starts at step 0.
  t.warmup_steps = 0;
  t.steps = 100;
  CHECK(lr(0) == Approx(1e-3).epsilon(1e-12));
  CHECK(lr(50) == Approx(5.5e-4).epsilon(1e-12));
  CHECK(lr(100) == Approx(1e-4).epsilon(1e-12));
  // min_lr_ratio = 0 decays to zero.
  t.min_lr_ratio = 0.0;
  CHECK(lr(50) == Approx(5e-4).epsilon(1e-12));
  CHECK(lr(100) == Approx(0.0).margin(1e-15));
}
