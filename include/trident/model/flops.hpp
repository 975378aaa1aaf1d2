// FLOPs of one training step of a config's model: what `trident plan` prices
// as model FLOPs (for MFU) and what `trident bench step` divides by its CPU
// time, so that both count the same work (share/trident/benchmarks/
// model_flops.py is the same formula for the PyTorch scripts).
#pragma once
#include "trident/core/config.hpp"

namespace trident::model {

// 3 x the forward's GEMM FLOPs (the backward is 2 x the forward) over
// `sequences` sequences of data.seq_len tokens: the q/k/v/o projections, the
// router and the top-k experts' SwiGLU (every routed copy once, no imbalance)
// or the dense SwiGLU, the LM head, and the causal attention's visible pairs.
double step_model_flops(const Config& cfg, double sequences);

}  // namespace trident::model
