// The router's shape and scoring: what the router ops of functional.hpp
// (and the pointer kernels of kernels/router.hpp) take. A plain type, no
// kernel: part of the public op API. The definitions of the scores and
// losses are in kernels/router.hpp.
#pragma once
#include <cstdint>

namespace trident::kernels {

enum class RouterScore { softmax, sigmoid };

// The shape and scoring of one router call.
struct RouterDims {
  int64_t T = 0;
  int E = 0;
  int k = 0;
  RouterScore score = RouterScore::softmax;
  bool norm_topk = true;  // weights renormalised over the chosen k
};

}  // namespace trident::kernels
