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

// n normal floats times `scale`, keyed by `key`, from element `offset` of
// its stream on (a rank's slice of a longer tensor).
inline std::vector<float> randn(int64_t n, uint64_t key, float scale = 1.0f, uint64_t offset = 0) {
  std::vector<float> x(static_cast<size_t>(n));
  rng::fill_normal(x.data(), n, key, offset, scale);
  return x;
}

// The same keyed by a name (rng::hash_name).
inline std::vector<float> randn(int64_t n, const std::string& name, float scale = 1.0f,
                                uint64_t offset = 0) {
  return randn(n, rng::hash_name(name), scale, offset);
}

// A host f32 tensor of `shape` holding randn(numel, key, scale): the same
// elements as the vector of that key.
inline Tensor random_tensor(std::vector<int64_t> shape, uint64_t key, float scale = 1.0f) {
  Tensor t(std::move(shape));
  rng::fill_normal(t.ptr(), t.numel(), key, 0, scale);
  return t;
}

// The same keyed by a name.
inline Tensor random_tensor(std::vector<int64_t> shape, const std::string& name,
                            float scale = 1.0f) {
  return random_tensor(std::move(shape), rng::hash_name(name), scale);
}

}  // namespace trident::testing
