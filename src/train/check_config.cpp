// Every layer's config rules (see train/check_config.hpp).
#include "trident/train/check_config.hpp"

#include "trident/parallel/cp/config_rules.hpp"
#include "trident/parallel/ep/config_rules.hpp"
#include "trident/parallel/pp/config_rules.hpp"

namespace trident::train {

void check_config(const Config& cfg, int world_size) {
  validate_config(cfg, world_size);
  // Document masks travel with the ring's K/V blocks; the Ulysses
  // all-to-all does not carry them yet (model/attention_core.cpp), so that
  // is refused here, before any output, rather than at the first forward.
  if (cfg.data.packing == Packing::documents && cp::ulysses_size(cfg.parallel) > 1)
    config_rule_failed(cfg, {"data.packing", "parallel.cp_mode"},
                       "data.packing = \"documents\" needs parallel.cp_mode = \"ring\" (got \"" +
                           config_name(cfg.parallel.cp_mode) +
                           "\"; ulysses and hybrid do not apply document masks yet)");
  ep::check_config(cfg, world_size);
  cp::check_config(cfg);
  pp::check_config(cfg);
}

}  // namespace trident::train
