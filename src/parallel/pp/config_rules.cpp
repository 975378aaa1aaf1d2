// Pipeline parallelism's config rules (see pp/config_rules.hpp).
#include "trident/parallel/pp/config_rules.hpp"

#include <algorithm>

#include "trident/parallel/pp/generators.hpp"

namespace trident::pp {

void check_config(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const DataConfig& d = cfg.data;
  auto s = [](long long v) { return std::to_string(v); };
  const std::string name = config_name(p.schedule);
  // The generators' rules, worded in the config's keys; interleaved with one
  // chunk is the config's own rule (1F1B is spelt "1f1b" there).
  const ScheduleRule broken =
      broken_schedule_rule(p.schedule, p.pp, p.vpp, std::max(d.num_microbatches, 1));
  if (broken == ScheduleRule::vpp_needs_chunked_schedule)
    config_rule_failed(cfg, {"parallel.vpp", "parallel.schedule"},
                       "parallel.vpp=" + s(p.vpp) +
                           " > 1 needs parallel.schedule = \"interleaved\" (got \"" + name +
                           "\"), or \"zb-v\" / \"dualpipev\" with parallel.vpp = 2");
  if (p.schedule == PipelineSchedule::interleaved && p.vpp < 2)
    config_rule_failed(
        cfg, {"parallel.schedule", "parallel.vpp"},
        "parallel.schedule = \"interleaved\" needs parallel.vpp >= 2 (got " + s(p.vpp) + ")");
  if (broken == ScheduleRule::v_needs_two_chunks)
    config_rule_failed(cfg, {"parallel.schedule", "parallel.vpp"},
                       "parallel.schedule = \"" + name +
                           "\" holds two chunks per rank (V placement) and needs parallel.vpp = 2 "
                           "(got " +
                           s(p.vpp) + ")");
  if (!p.pp_layout.empty()) {
    // Each entry >= 1 is the key's own rule (core/config.cpp).
    if (int(p.pp_layout.size()) != p.pp * p.vpp)
      config_rule_failed(cfg, {"parallel.pp_layout", "parallel.pp", "parallel.vpp"},
                         "parallel.pp_layout has " + s(int(p.pp_layout.size())) +
                             " entries; it needs one per virtual stage, parallel.pp*parallel.vpp=" +
                             s(p.pp * p.vpp));
    long long sum = 0;
    for (int n : p.pp_layout) sum += n;
    if (sum != cfg.model.n_layers)
      config_rule_failed(cfg, {"parallel.pp_layout", "model.n_layers"},
                         "parallel.pp_layout holds " + s(sum) +
                             " layers in all, model.n_layers=" + s(cfg.model.n_layers));
  } else if (cfg.model.n_layers % (p.pp * p.vpp) != 0) {
    config_rule_failed(cfg, {"model.n_layers", "parallel.pp", "parallel.vpp"},
                       "model.n_layers=" + s(cfg.model.n_layers) +
                           " must be divisible by parallel.pp*parallel.vpp=" + s(p.pp * p.vpp) +
                           " (every model chunk gets the same number of layers), or "
                           "parallel.pp_layout must say how many each gets");
  }
  if (broken == ScheduleRule::too_few_microbatches)
    config_rule_failed(cfg, {"data.num_microbatches", "parallel.schedule", "parallel.pp"},
                       "data.num_microbatches=" + s(d.num_microbatches) +
                           " must be >= " + s(min_microbatches(p.schedule, p.pp, p.vpp)) +
                           " for schedule \"" + name + "\" with parallel.pp=" + s(p.pp));
}

}  // namespace trident::pp
