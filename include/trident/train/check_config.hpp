// Every layer's config rules in one call, for the commands that take a config:
// core's (model shapes, data, output, topology, the mesh against the world),
// then expert, context and pipeline parallelism's, each from its own layer.
#pragma once
#include "trident/core/config.hpp"

namespace trident::train {

// InputError naming the key(s) of the first broken rule; world_size <= 0
// skips the rules that need it.
void check_config(const Config& cfg, int world_size);

}  // namespace trident::train
