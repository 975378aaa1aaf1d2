// Counter-based random numbers: value = f(key, index), no state.
//
// Parameters are initialised from (hash of the parameter name, global element
// index), so every mesh, whatever slice of a parameter a rank holds, starts
// from the same weights. Synthetic data is keyed by (seed, step, sample).
#pragma once
#include <cstdint>
#include <string_view>

namespace trident::rng {

// 64-bit mix (splitmix64 finaliser): a bijection with good avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a of a name, mixed: the key of a named stream.
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ULL;
  return mix64(h);
}

constexpr uint64_t combine(uint64_t a, uint64_t b) {
  return mix64(a ^ mix64(b + 0x632be59bd9b4e019ULL));
}

// Raw 64 random bits for (key, index).
constexpr uint64_t bits(uint64_t key, uint64_t index) { return mix64(combine(key, index)); }

// Uniform in [0, 1), 24 bits of precision.
inline float uniform(uint64_t key, uint64_t index) {
  return static_cast<float>(bits(key, index) >> 40) * (1.0f / 16777216.0f);
}

// Standard normal (Box-Muller on two independent uniforms of the same index).
float normal(uint64_t key, uint64_t index);

// Uniform integer in [0, n).
inline uint64_t below(uint64_t key, uint64_t index, uint64_t n) { return bits(key, index) % n; }

// Fill out[i] = scale * normal(key, offset + i).
void fill_normal(float* out, int64_t n, uint64_t key, uint64_t offset, float scale);

}  // namespace trident::rng
