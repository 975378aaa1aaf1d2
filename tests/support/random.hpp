// Random inputs of the tests: normal floats from the counter-based RNG
// (core/rng.hpp), keyed by a number or a name, so every rank and every run
// draws the same values for one key (the MPI tests compare a shard with the
// whole tensor each rank regenerates). One place instead of a copy per file.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "trident/core/rng.hpp"
#include "trident/core/tensor.hpp"

namespace trident::testing {

// n normal floats times `scale`, keyed by `key`.
inline std::vector<float> randn(int64_t n, uint64_t key, float scale = 1.0f) {
  std::vector<float> x(static_cast<size_t>(n));
  rng::fill_normal(x.data(), n, key, 0, scale);
  return x;
}

// The same keyed by a name (rng::hash_name).
inline std::vector<float> randn(int64_t n, const std::string& name, float scale = 1.0f) {
  return randn(n, rng::hash_name(name), scale);
}

// A host f32 tensor of `shape` holding randn(numel, name, scale): the same
// elements as the vector of that name.
inline Tensor random_tensor(std::vector<int64_t> shape, const std::string& name,
                            float scale = 1.0f) {
  Tensor t(std::move(shape));
  rng::fill_normal(t.ptr(), t.numel(), rng::hash_name(name), 0, scale);
  return t;
}

}  // namespace trident::testing
