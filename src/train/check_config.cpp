// Every layer's config rules (see train/check_config.hpp).
#include "trident/train/check_config.hpp"

#include "trident/parallel/cp/config_rules.hpp"
#include "trident/parallel/ep/config_rules.hpp"
#include "trident/parallel/pp/config_rules.hpp"

namespace trident::train {

void check_config(const Config& cfg, int world_size) {
  validate_config(cfg, world_size);
  ep::check_config(cfg, world_size);
  cp::check_config(cfg);
  pp::check_config(cfg);
}

}  // namespace trident::train
