// trident eval --tokens FILE --logits-out OUT.h5: the logits and per-token
// losses of given sequences under a checkpoint, on any mesh.
//
// FILE is a flat token file (data.token_dtype); sequence k is tokens
// [k seq_len, (k + 1) seq_len) and its targets are the tokens one further,
// so the file holds N = (tokens - 1) / seq_len sequences; N must be a
// multiple of the global batch (data.micro_batch_size x
// data.num_microbatches x dp). Every rank computes its part of each step
// (pipeline stage, cp share, dp slice, experts) as in training, without an
// update; the last stage's logits travel to world rank 0, which writes
// OUT.h5 (format "trident-logits", version 1):
//   /logits   float32 [N, seq_len, vocab_size]
//   /loss     float32 [N, seq_len]  -log softmax(logits)[target], in fp64
//   /tokens   int32   [N, seq_len]
//   /targets  int32   [N, seq_len]
//   root attributes: format, format_version, checkpoint, config_toml,
//   mean_loss (over every target, as `trident run` reports a step's loss).
#pragma once
#include <string>

#include "trident/core/config.hpp"
#include "trident/topo/topology.hpp"

namespace trident::train {

// cfg: checked against comms' world, with data.task = "tokens" and
// data.token_file = FILE. Collective over comms.world; returns 0.
int eval_logits(const Config& cfg, Communicators& comms, const std::string& checkpoint,
                const std::string& out_path);

}  // namespace trident::train
