// Expert parallelism's config rules: parallel.ep against the experts and
// against the ranks of one pipeline stage.
#pragma once
#include "trident/core/config.hpp"

namespace trident::ep {

// InputError (config_rule_failed) naming the keys of the first broken rule;
// world_size <= 0 skips the rule that needs it.
void check_config(const Config& cfg, int world_size);

}  // namespace trident::ep
