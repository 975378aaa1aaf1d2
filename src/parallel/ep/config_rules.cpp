// Expert parallelism's config rules (see ep/config_rules.hpp).
#include "trident/parallel/ep/config_rules.hpp"

namespace trident::ep {

void check_config(const Config& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  const int experts = cfg.model.n_experts;
  auto s = [](long long v) { return std::to_string(v); };
  if (experts > 0 && experts % p.ep != 0)
    config_rule_failed(
        cfg, {"parallel.ep", "model.n_experts"},
        "model.n_experts=" + s(experts) + " must be divisible by parallel.ep=" + s(p.ep));
  if (experts == 0 && p.ep > 1)
    config_rule_failed(cfg, {"parallel.ep", "model.n_experts"},
                       "parallel.ep=" + s(p.ep) + " needs an MoE model (model.n_experts > 0)");
  if (world_size <= 0 || world_size % (p.pp * p.cp) != 0) return;
  const int dp = world_size / (p.pp * p.cp);
  if ((dp * p.cp) % p.ep != 0)
    config_rule_failed(cfg, {"parallel.ep", "parallel.cp"},
                       "parallel.ep=" + s(p.ep) + " must divide dp*cp = " + s(dp) + "*" + s(p.cp) +
                           " = " + s(dp * p.cp) + " (the ranks of one pipeline stage; world size " +
                           s(world_size) + ")");
}

}  // namespace trident::ep
