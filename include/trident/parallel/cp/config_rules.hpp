// Context parallelism's config rules: how data.seq_len splits into the
// chunks of parallel.cp_layout, and how parallel.cp_mode / cp_ulysses split
// the cp group into all-to-all (Ulysses) groups and a ring. One place for the
// rules, used by the config check (pointing at the key's line), by the
// attention cores and by the planner.
#pragma once
#include <cstdint>
#include <string>

#include "trident/core/config.hpp"

namespace trident::cp {

// The broken rule as one line naming data.seq_len and parallel.cp, or "" when
// seq_len splits into cp (contiguous) or 2*cp (zigzag) equal chunks. The same
// split serves every cp_mode: the ring's cp/u groups take 2*(cp/u) (or cp/u)
// chunks, and each group's tokens split evenly over its u Ulysses ranks.
std::string layout_rule_broken(int64_t seq_len, int cp, CpLayout layout);

// The size u of the all-to-all (Ulysses) groups of a cp group: ring 1,
// ulysses cp, hybrid parallel.cp_ulysses. The ring then has cp/u ranks.
int ulysses_size(CpMode mode, int cp, int cp_ulysses);
inline int ulysses_size(const ParallelConfig& p) {
  return ulysses_size(p.cp_mode, p.cp, p.cp_ulysses);
}

// The broken rule of (cp_mode, cp, cp_ulysses) as one line naming the keys,
// or "": ring and ulysses take cp_ulysses = 0 (or, for ulysses, = cp); hybrid
// needs 1 < cp_ulysses < cp with cp_ulysses | cp.
std::string mode_rule_broken(CpMode mode, int cp, int cp_ulysses);

// The broken head rule for Ulysses groups of u ranks, or "": n_heads % u == 0
// (each rank takes n_heads/u query heads), and n_kv_heads % u == 0 or
// u % n_kv_heads == 0 (each rank takes n_kv_heads/u K/V heads, or the one
// K/V head its query heads share, replicated on u/n_kv_heads ranks).
std::string heads_rule_broken(int n_heads, int n_kv_heads, int u);

// InputError (config_rule_failed) if cfg breaks a rule above.
void check_config(const Config& cfg);

}  // namespace trident::cp
