// The small configs the tests train and plan with: one builder instead of a
// copy per test file. Each field left out keeps its value here; a field not
// named here keeps Config's default (core/config.hpp), so a test sets only
// what it is about and a reader sees the whole shape in one line.
#pragma once
#include "trident/core/config.hpp"

namespace trident::testing {

// The model. Defaults: 2 layers of d 32, 4 heads over 2 K/V heads (GQA),
// 4 experts of which 2 per token in every layer.
struct TinyModel {
  int vocab = 32;
  int d_model = 32;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int ffn = 48;
  int experts = 4;  // 0: dense
  int top_k = 2;
  int moe_every = 1;
};

// The data. Defaults: the recall task, sequences of 32, 4 micro-batches of 1.
struct TinyData {
  DataTask task = DataTask::recall;
  int seq_len = 32;
  int micro_batch = 1;
  int microbatches = 4;
};

// The optimizer's schedule. Defaults: Config's own (a test that trains names them).
struct TinyTrain {
  int steps = TrainConfig{}.steps;
  double lr = TrainConfig{}.lr;
  int warmup = TrainConfig{}.warmup_steps;
  double grad_clip = TrainConfig{}.grad_clip;
};

inline Config tiny_config(const TinyModel& m, const TinyData& d = {}, const TinyTrain& t = {}) {
  Config c;
  c.model.vocab_size = m.vocab;
  c.model.d_model = m.d_model;
  c.model.n_layers = m.layers;
  c.model.n_heads = m.heads;
  c.model.n_kv_heads = m.kv_heads;
  c.model.ffn_hidden = m.ffn;
  c.model.n_experts = m.experts;
  c.model.top_k = m.top_k;
  c.model.moe_every = m.moe_every;
  c.data.task = d.task;
  c.data.seq_len = d.seq_len;
  c.data.micro_batch_size = d.micro_batch;
  c.data.num_microbatches = d.microbatches;
  c.train.steps = t.steps;
  c.train.lr = t.lr;
  c.train.warmup_steps = t.warmup;
  c.train.grad_clip = t.grad_clip;
  return c;
}

// A run under mpirun in a test: 60 s deadlines (a hung rank fails the test
// well inside ctest's timeout) and no timeline file.
inline Config& test_run_settings(Config& c) {
  c.runtime.timeout_s = 60;
  c.output.timeline = false;
  return c;
}

}  // namespace trident::testing
