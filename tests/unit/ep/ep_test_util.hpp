// Random test data for the EP tests: counter RNG, so every rank can build
// the same global token set and take its slice.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/core/rng.hpp"

namespace trident::eptest {

inline std::vector<float> randn(const std::string& key, int64_t n, float scale = 1.0f,
                                uint64_t offset = 0) {
  std::vector<float> v(static_cast<size_t>(n));
  rng::fill_normal(v.data(), n, rng::hash_name(key), offset, scale);
  return v;
}

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

}  // namespace trident::eptest
