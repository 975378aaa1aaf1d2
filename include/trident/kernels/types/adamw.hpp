// AdamW's hyper-parameters: what the optimizer passes to the adamw_step op
// (functional.hpp). A plain type, no kernel: part of the public op API.
#pragma once

namespace trident::kernels {

// Decoupled weight decay; the step is counted from 1.
struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

}  // namespace trident::kernels
