// Helpers of the EP tests; their random data is tests/support/random.hpp's
// randn (counter RNG, so every rank can build the same global token set and
// take its slice).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "random.hpp"

namespace trident::eptest {

inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

}  // namespace trident::eptest
