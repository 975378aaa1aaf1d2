// Pipeline parallelism's config rules: parallel.schedule and parallel.vpp
// together, the layers per model chunk, and the micro-batches a schedule
// needs (the same rules make_schedule applies to the CLI's flags).
#pragma once
#include "trident/core/config.hpp"

namespace trident::pp {

// InputError (config_rule_failed) naming the keys of the first broken rule.
void check_config(const Config& cfg);

}  // namespace trident::pp
