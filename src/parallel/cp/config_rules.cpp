// Context parallelism's config rules (see cp/config_rules.hpp).
#include "trident/parallel/cp/config_rules.hpp"

namespace trident::cp {

std::string layout_rule_broken(int64_t seq_len, int cp, CpLayout layout) {
  const bool zigzag = layout == CpLayout::zigzag;
  const int64_t chunks = zigzag ? 2 * int64_t(cp) : int64_t(cp);
  if (seq_len > 0 && seq_len % chunks == 0) return "";
  return "data.seq_len=" + std::to_string(seq_len) + " must be divisible by " +
         (zigzag ? "2*parallel.cp=" : "parallel.cp=") + std::to_string(chunks) +
         (zigzag ? " (zigzag layout: 2*cp chunks)" : " (contiguous layout)");
}

void check_config(const Config& cfg) {
  const std::string broken =
      layout_rule_broken(cfg.data.seq_len, cfg.parallel.cp, cfg.parallel.cp_layout);
  if (!broken.empty())
    config_rule_failed(cfg, {"data.seq_len", "parallel.cp", "parallel.cp_layout"}, broken);
}

}  // namespace trident::cp
