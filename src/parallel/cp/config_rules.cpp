// Context parallelism's config rules (see cp/config_rules.hpp).
#include "trident/parallel/cp/config_rules.hpp"

namespace trident::cp {

namespace {
std::string s(long long v) { return std::to_string(v); }
}  // namespace

std::string layout_rule_broken(int64_t seq_len, int cp, CpLayout layout) {
  // docs: at least the 2*cp chunks of zig-zag (its layout without packing)
  const bool zigzag = layout != CpLayout::contiguous;
  const int64_t chunks = zigzag ? 2 * int64_t(cp) : int64_t(cp);
  if (seq_len > 0 && seq_len % chunks == 0) return "";
  return "data.seq_len=" + std::to_string(seq_len) + " must be divisible by " +
         (zigzag ? "2*parallel.cp=" : "parallel.cp=") + std::to_string(chunks) +
         (layout == CpLayout::docs     ? " (docs layout: 2*cp chunks or more)"
          : layout == CpLayout::zigzag ? " (zigzag layout: 2*cp chunks)"
                                       : " (contiguous layout)");
}

int ulysses_size(CpMode mode, int cp, int cp_ulysses) {
  switch (mode) {
    case CpMode::ring:
      return 1;
    case CpMode::ulysses:
      return cp;
    case CpMode::hybrid:
      return cp_ulysses;
  }
  return 1;
}

std::string mode_rule_broken(CpMode mode, int cp, int u) {
  if (mode == CpMode::ring && u != 0)
    return "parallel.cp_ulysses=" + s(u) +
           " needs parallel.cp_mode=\"hybrid\" (ring has no all-to-all groups; leave it 0)";
  if (mode == CpMode::ulysses && u != 0 && u != cp)
    return "parallel.cp_ulysses=" + s(u) + " must be 0 or parallel.cp=" + s(cp) +
           " with parallel.cp_mode=\"ulysses\" (hybrid splits cp into all-to-all groups and a "
           "ring)";
  if (mode == CpMode::hybrid && (u < 2 || u >= cp || cp % u != 0))
    return "parallel.cp_mode=\"hybrid\" needs parallel.cp_ulysses=u with 1 < u < parallel.cp=" +
           s(cp) + " and u dividing cp (got cp_ulysses=" + s(u) + ")";
  return "";
}

std::string heads_rule_broken(int n_heads, int n_kv_heads, int u) {
  if (u <= 1) return "";
  if (n_heads % u != 0)
    return "model.n_heads=" + s(n_heads) + " must be divisible by the Ulysses group size " + s(u) +
           " (each rank takes n_heads/u query heads)";
  if (n_kv_heads % u != 0 && u % n_kv_heads != 0)
    return "model.n_kv_heads=" + s(n_kv_heads) + " and the Ulysses group size " + s(u) +
           " must divide one another (each rank takes n_kv_heads/u K/V heads, or one K/V head "
           "replicated on u/n_kv_heads ranks)";
  return "";
}

namespace {
// parallel.cp_layout = "docs": the ring's alone (the Ulysses all-to-all
// keeps one layout for every sequence).
void check_docs_layout(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  if (p.cp_layout != CpLayout::docs) return;
  if (ulysses_size(p) > 1)
    config_rule_failed(cfg, {"parallel.cp_layout", "parallel.cp_mode"},
                       "parallel.cp_layout=\"docs\" needs parallel.cp_mode=\"ring\"");
}
}  // namespace

void check_config(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  const std::string broken = layout_rule_broken(cfg.data.seq_len, p.cp, p.cp_layout);
  if (!broken.empty())
    config_rule_failed(cfg, {"data.seq_len", "parallel.cp", "parallel.cp_layout"}, broken);
  const std::string mode = mode_rule_broken(p.cp_mode, p.cp, p.cp_ulysses);
  if (!mode.empty())
    config_rule_failed(cfg, {"parallel.cp_ulysses", "parallel.cp_mode", "parallel.cp"}, mode);
  const std::string heads =
      heads_rule_broken(cfg.model.n_heads, cfg.model.n_kv_heads, ulysses_size(p));
  if (heads.rfind("model.n_kv_heads", 0) == 0)
    config_rule_failed(cfg, {"model.n_kv_heads", "parallel.cp_ulysses", "parallel.cp"}, heads);
  if (!heads.empty())
    config_rule_failed(cfg, {"model.n_heads", "parallel.cp_ulysses", "parallel.cp"}, heads);
  check_docs_layout(cfg);
}

}  // namespace trident::cp
