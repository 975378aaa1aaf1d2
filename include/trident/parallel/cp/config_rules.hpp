// Context parallelism's config rules: how data.seq_len splits into the
// chunks of parallel.cp_layout. One place for the rule, used by the config
// check (pointing at the key's line) and by the ring itself.
#pragma once
#include <cstdint>
#include <string>

#include "trident/core/config.hpp"

namespace trident::cp {

// The broken rule as one line naming data.seq_len and parallel.cp, or "" when
// seq_len splits into cp (contiguous) or 2*cp (zigzag) equal chunks.
std::string layout_rule_broken(int64_t seq_len, int cp, CpLayout layout);

// InputError (config_rule_failed) if cfg breaks a rule above.
void check_config(const Config& cfg);

}  // namespace trident::cp
