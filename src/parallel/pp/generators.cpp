// Schedule generators: the per-rank compute order of AFAB, 1F1B, interleaved
// 1F1B and ZB-H1, plus their rules and closed-form bubbles.
#include "trident/parallel/pp/generators.hpp"

#include <algorithm>
#include <utility>

#include "trident/core/error.hpp"

namespace trident::pp {

namespace {

Schedule empty_schedule(const std::string& name, int pp, int m, int vpp, bool split) {
  Schedule s;
  s.name = name;
  s.pp = pp;
  s.vpp = vpp;
  s.microbatches = m;
  s.split_backward = split;
  s.ranks.resize(pp);
  return s;
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw InputError(msg);
}

void check_common(const std::string& name, int pp, int m, int vpp) {
  require(pp >= 1, "--pp " + std::to_string(pp) + ": must be >= 1");
  require(vpp >= 1, "--vpp " + std::to_string(vpp) + ": must be >= 1");
  require(m >= 1, "--microbatches " + std::to_string(m) + ": must be >= 1");
  require(vpp == 1 || name == "interleaved",
          "--vpp " + std::to_string(vpp) +
              ": more than one chunk per rank needs the interleaved schedule (got '" + name + "')");
  const int need = min_microbatches(name, pp, vpp);
  require(m >= need, "--microbatches " + std::to_string(m) + ": schedule '" + name +
                         "' with pp=" + std::to_string(pp) + " vpp=" + std::to_string(vpp) +
                         " needs at least " + std::to_string(need) + " micro-batches");
  // The same rule as the config's (data.num_microbatches), so that every
  // schedule the CLI accepts is one a training run accepts.
  require(name != "interleaved" || m % pp == 0,
          "--microbatches " + std::to_string(m) +
              ": schedule 'interleaved' needs a multiple of --pp " + std::to_string(pp));
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"afab", "1f1b", "interleaved", "zb-h1"};
  return names;
}

int min_microbatches(const std::string& name, int pp, int vpp) {
  if (name == "afab" || name == "gpipe" || name == "1f1b" || name == "zb-h1") return 1;
  if (name == "interleaved") return std::max(pp, 1);
  throw InputError("schedule '" + name + "': unknown (expected afab, 1f1b, interleaved or zb-h1)");
}

Schedule make_schedule(const std::string& name, int pp, int m, int vpp) {
  if (name == "afab" || name == "gpipe") {
    check_common("afab", pp, m, vpp);
    return afab(pp, m);
  }
  if (name == "1f1b") {
    check_common(name, pp, m, vpp);
    return one_f_one_b(pp, m);
  }
  if (name == "interleaved") {
    check_common(name, pp, m, vpp);
    return interleaved_one_f_one_b(pp, m, vpp);
  }
  if (name == "zb-h1") {
    check_common(name, pp, m, vpp);
    return zero_bubble_h1(pp, m);
  }
  min_microbatches(name, pp, vpp);  // throws the unknown-name error
  throw InputError("schedule '" + name + "': unknown");
}

Schedule afab(int pp, int m) {
  Schedule s = empty_schedule("afab", pp, m, 1, false);
  for (int r = 0; r < pp; ++r) {
    for (int mb = 0; mb < m; ++mb) s.ranks[r].push_back({r, Op::F, mb});
    for (int mb = 0; mb < m; ++mb) s.ranks[r].push_back({r, Op::B, mb});
  }
  return s;
}

Schedule one_f_one_b(int pp, int m) {
  Schedule s = empty_schedule("1f1b", pp, m, 1, false);
  for (int r = 0; r < pp; ++r) {
    // Rank r starts its first backward once the first micro-batch has come
    // back from the pp-1-r ranks after it: that many forwards run ahead.
    const int warmup = std::min(pp - 1 - r, m);
    auto& row = s.ranks[r];
    int f = 0, b = 0;
    for (; f < warmup; ++f) row.push_back({r, Op::F, f});
    for (; f < m; ++f, ++b) {
      row.push_back({r, Op::F, f});
      row.push_back({r, Op::B, b});
    }
    for (; b < m; ++b) row.push_back({r, Op::B, b});
  }
  return s;
}

Schedule interleaved_one_f_one_b(int pp, int m, int vpp) {
  if (vpp == 1) {
    Schedule s = one_f_one_b(pp, m);
    s.name = "interleaved";
    return s;
  }
  Schedule s = empty_schedule("interleaved", pp, m, vpp, false);
  // Megatron order: micro-batches in groups of pp; a group goes through chunk
  // 0, then chunk 1, ... (backward: last chunk first). The remainder m % pp
  // joins the first group: the warm-up below covers the first group's chunks,
  // and every later group is no larger, so no backward comes due before its
  // forward (see generators.hpp for why the other placements fail).
  std::vector<std::pair<int, int>> fwd, bwd;  // (chunk, micro-batch)
  int first_group = 0;
  for (int start = 0; start < m;) {
    const int end = std::min(m, start == 0 ? pp + m % pp : start + pp);
    for (int c = 0; c < vpp; ++c)
      for (int mb = start; mb < end; ++mb) fwd.push_back({c, mb});
    for (int c = vpp - 1; c >= 0; --c)
      for (int mb = start; mb < end; ++mb) bwd.push_back({c, mb});
    if (start == 0) first_group = end;
    start = end;
  }
  const int total = m * vpp;
  for (int r = 0; r < pp; ++r) {
    // Enough forwards in flight that the first backward's gradient, which
    // passes every rank once per chunk, can come back: Megatron's count with
    // the first group's size in place of pp.
    const int warmup = std::min(total, (pp - r - 1) * 2 + (vpp - 1) * first_group);
    auto& row = s.ranks[r];
    int f = 0, b = 0;
    for (; f < warmup; ++f) row.push_back({s.stage_of(r, fwd[f].first), Op::F, fwd[f].second});
    for (; f < total; ++f, ++b) {
      row.push_back({s.stage_of(r, fwd[f].first), Op::F, fwd[f].second});
      row.push_back({s.stage_of(r, bwd[b].first), Op::B, bwd[b].second});
    }
    for (; b < total; ++b) row.push_back({s.stage_of(r, bwd[b].first), Op::B, bwd[b].second});
  }
  return s;
}

Schedule zero_bubble_h1(int pp, int m) {
  Schedule s = empty_schedule("zb-h1", pp, m, 1, true);
  for (int r = 0; r < pp; ++r) {
    // Same F/B order (and so the same activation memory) as 1F1B, but the
    // weight gradients are held back: rank r keeps r of them pending, so its
    // B reaches rank r-1 without waiting behind a W, and the held-back W's
    // fill the cool-down gaps where 1F1B idles.
    const int warmup = std::min(pp - 1 - r, m);
    const int defer = r;
    auto& row = s.ranks[r];
    int f = 0, b = 0, w = 0;
    for (; f < warmup; ++f) row.push_back({r, Op::F, f});
    for (; f < m; ++f) {
      row.push_back({r, Op::F, f});
      row.push_back({r, Op::B, b++});
      if (b - w > defer) row.push_back({r, Op::W, w++});
    }
    for (; b < m; ++b) {
      row.push_back({r, Op::B, b});
      row.push_back({r, Op::W, w++});
    }
    for (; w < m; ++w) row.push_back({r, Op::W, w});
  }
  return s;
}

ClosedForm closed_form_bubble(const std::string& name, int pp, int m, int vpp, double t_f,
                              double t_b, double t_w) {
  ClosedForm c;
  const double p1 = pp - 1;
  if (name == "afab" || name == "gpipe" || name == "1f1b" || (name == "interleaved" && vpp == 1)) {
    c.ratio = p1 / m;
    c.formula = "(p-1)/m";
  } else if (name == "interleaved") {
    if (m % pp != 0) return c;
    c.ratio = p1 / (static_cast<double>(vpp) * m);
    c.formula = "(p-1)/(v*m)";
  } else if (name == "zb-h1") {
    if (m < pp || t_w > t_f + t_b) return c;
    c.ratio = p1 * (t_f + t_b - t_w) / (m * (t_f + t_b + t_w));
    c.formula = "(p-1)(tF+tB-tW)/(m(tF+tB+tW))";
  } else {
    return c;
  }
  c.fraction = c.ratio / (1 + c.ratio);
  return c;
}

}  // namespace trident::pp
