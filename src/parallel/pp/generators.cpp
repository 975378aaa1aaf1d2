// Schedule generators: the per-rank compute order of AFAB, 1F1B, interleaved
// 1F1B, ZB-H1, ZB-V and DualPipeV, plus their rules and closed-form bubbles.
#include "trident/parallel/pp/generators.hpp"

#include <algorithm>
#include <deque>
#include <utility>

#include "trident/core/error.hpp"

namespace trident::pp {

namespace {

Schedule empty_schedule(PipelineSchedule kind, int pp, int m, int vpp, bool split) {
  Schedule s;
  s.name = config_name(kind);
  s.pp = pp;
  s.vpp = vpp;
  s.microbatches = m;
  s.split_backward = split;
  s.placement = schedule_placement(kind, pp, vpp);
  s.ranks.resize(pp);
  return s;
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw InputError(msg);
}

bool v_shaped(PipelineSchedule s) {
  return s == PipelineSchedule::zb_v || s == PipelineSchedule::dualpipev;
}

void check_common(PipelineSchedule kind, int pp, int m, int vpp) {
  const std::string name = config_name(kind);
  require(pp >= 1, "--pp " + std::to_string(pp) + ": must be >= 1");
  require(vpp >= 1, "--vpp " + std::to_string(vpp) + ": must be >= 1");
  require(m >= 1, "--microbatches " + std::to_string(m) + ": must be >= 1");
  switch (broken_schedule_rule(kind, pp, vpp, m)) {
    case ScheduleRule::none:
      return;
    case ScheduleRule::vpp_needs_chunked_schedule:
      throw InputError("--vpp " + std::to_string(vpp) +
                       ": more than one chunk per rank needs the interleaved, zb-v or dualpipev "
                       "schedule (got '" +
                       name + "')");
    case ScheduleRule::v_needs_two_chunks:
      throw InputError("--vpp " + std::to_string(vpp) + ": schedule '" + name +
                       "' holds two chunks per rank (V placement: stages r and 2*pp-1-r); needs "
                       "--vpp 2");
    case ScheduleRule::too_few_microbatches:
      throw InputError("--microbatches " + std::to_string(m) + ": schedule '" + name +
                       "' with pp=" + std::to_string(pp) + " vpp=" + std::to_string(vpp) +
                       " needs at least " + std::to_string(min_microbatches(kind, pp, vpp)) +
                       " micro-batches");
  }
}

// One rank's list under construction for the V schedules: per-chunk counters
// of F, B and W, so each call appends the chunk's next micro-batch.
struct VRow {
  VRow(std::vector<Action>& r, int chunk0_stage, int chunk1_stage)
      : row(r), stage{chunk0_stage, chunk1_stage} {}
  std::vector<Action>& row;
  int stage[2];  // chunk 0 (going down the ranks) and chunk 1 (coming back)
  int f[2] = {0, 0}, b[2] = {0, 0}, w[2] = {0, 0};
  std::deque<std::pair<int, int>> deferred;  // (chunk, micro-batch) whose W waits

  void forward(int c, bool overlapped = false) {
    row.push_back({stage[c], Op::F, f[c]++, overlapped});
  }
  void input_grad(int c) {  // B now, W deferred
    deferred.push_back({c, b[c]});
    row.push_back({stage[c], Op::B, b[c]++});
  }
  void weight_grad(int c) { row.push_back({stage[c], Op::W, w[c]++}); }
  void full_backward(int c) {  // B and W together
    const int mb = b[c]++;
    row.push_back({stage[c], Op::B, mb});
    row.push_back({stage[c], Op::W, mb});
    ++w[c];
  }
  void oldest_deferred_weight_grad() {
    if (deferred.empty()) return;
    const auto [c, mb] = deferred.front();
    deferred.pop_front();
    row.push_back({stage[c], Op::W, mb});
    ++w[c];
  }
};

// Keeps the actions of micro-batches below m (the V schedules generate for
// more to fill the V).
void drop_extra_microbatches(Schedule& s) {
  for (auto& row : s.ranks)
    std::erase_if(row, [&](const Action& a) { return a.microbatch >= s.microbatches; });
}

// DualPipeV's overlapped slot: a forward of one chunk beside a full
// backward of the other.
void dual_pipe_v_overlapped_slot(VRow& v, int f_chunk, int b_chunk) {
  v.forward(f_chunk, true);
  v.full_backward(b_chunk);
}

// DualPipeV steps 4-5 on rank r.
void dual_pipe_v_steady(VRow& v, int pp, int m, int r) {
  // 4: the steady state, two overlapped F+B slots per step (the last rank's
  // first pair runs serially: the turn of the V leaves nothing to overlap).
  for (int i = 0; i < m - 2 * pp + r + 1; ++i) {
    if (i == 0 && r == pp - 1) {
      v.forward(0);
      v.full_backward(1);
    } else {
      dual_pipe_v_overlapped_slot(v, 0, 1);
    }
    dual_pipe_v_overlapped_slot(v, 1, 0);
  }
  // 5: chunk 1 drains while chunk 0's backwards still overlap its forwards.
  for (int i = 0; i < pp - r - 1; ++i) {
    v.full_backward(1);
    dual_pipe_v_overlapped_slot(v, 1, 0);
  }
}

// DualPipeV steps 6-8 on rank r: the remaining backwards; from the middle of
// step 6 on, their W's are deferred into the tail where the pipeline drains.
void dual_pipe_v_drain(VRow& v, int pp, int r) {
  bool split = false;
  auto backward = [&](int c) { split ? v.input_grad(c) : v.full_backward(c); };
  for (int i = 0; i < r + 1; ++i) {
    if (i == (r + 1) / 2 && r % 2 == 1) split = true;
    backward(1);
    if (i == (r + 1) / 2 && r % 2 == 0) split = true;
    backward(0);
  }
  for (int i = 0; i < pp - r - 1; ++i) {
    v.oldest_deferred_weight_grad();
    backward(0);
  }
  while (!v.deferred.empty()) v.oldest_deferred_weight_grad();
}

// The schedules with one chunk per rank, whose bubble is the plain (p-1)/m.
bool one_chunk_schedule(const std::string& name, int vpp) {
  return name == "afab" || name == "gpipe" || name == "1f1b" || (name == "interleaved" && vpp == 1);
}

}  // namespace

int default_vpp(PipelineSchedule schedule) { return v_shaped(schedule) ? 2 : 1; }
int default_vpp(const std::string& name) { return default_vpp(parse_schedule(name)); }

Placement schedule_placement(PipelineSchedule schedule, int pp, int vpp) {
  return v_shaped(schedule) ? Placement::v_shape(pp) : Placement::loop(pp, vpp);
}

namespace {

// Every schedule, in PipelineSchedule's order (its names are the config's):
// the fewest micro-batches it runs with, and its generator. The one list
// the rules and the dispatch read.
struct ScheduleKind {
  int (*min_microbatches)(int pp);
  Schedule (*make)(int pp, int m, int vpp);
};

const ScheduleKind& schedule_kind(PipelineSchedule schedule) {
  static const ScheduleKind kinds[] = {
      {[](int) { return 1; }, [](int pp, int m, int) { return afab(pp, m); }},
      {[](int) { return 1; }, [](int pp, int m, int) { return one_f_one_b(pp, m); }},
      {[](int) { return 1; },
       [](int pp, int m, int vpp) { return interleaved_one_f_one_b(pp, m, vpp); }},
      {[](int) { return 1; }, [](int pp, int m, int) { return zero_bubble_h1(pp, m); }},
      {[](int) { return 1; }, [](int pp, int m, int) { return zero_bubble_v(pp, m); }},
      {[](int pp) { return 2 * std::max(pp, 1); },
       [](int pp, int m, int) { return dual_pipe_v(pp, m); }},
  };
  static_assert(std::size(kinds) == ConfigNames<PipelineSchedule>::names.size());
  return kinds[size_t(schedule)];
}

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names(ConfigNames<PipelineSchedule>::names.begin(),
                                              ConfigNames<PipelineSchedule>::names.end());
  return names;
}

PipelineSchedule parse_schedule(const std::string& name) {
  if (auto s = parse_config_name<PipelineSchedule>(name == "gpipe" ? "afab" : name)) return *s;
  const auto& names = schedule_names();
  std::string expected;
  for (size_t i = 0; i < names.size(); ++i)
    expected += std::string(i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  throw InputError("schedule '" + name + "': unknown (expected " + expected + ")");
}

ScheduleRule broken_schedule_rule(PipelineSchedule schedule, int pp, int vpp, int m) {
  if (vpp > 1 && schedule != PipelineSchedule::interleaved && !v_shaped(schedule))
    return ScheduleRule::vpp_needs_chunked_schedule;
  if (v_shaped(schedule) && vpp != 2) return ScheduleRule::v_needs_two_chunks;
  if (m < min_microbatches(schedule, pp, vpp)) return ScheduleRule::too_few_microbatches;
  return ScheduleRule::none;
}

int min_microbatches(PipelineSchedule schedule, int pp, int vpp) {
  (void)vpp;
  return schedule_kind(schedule).min_microbatches(pp);
}
int min_microbatches(const std::string& name, int pp, int vpp) {
  return min_microbatches(parse_schedule(name), pp, vpp);
}

Schedule make_schedule(PipelineSchedule schedule, int pp, int m, int vpp) {
  check_common(schedule, pp, m, vpp);
  return schedule_kind(schedule).make(pp, m, vpp);
}
Schedule make_schedule(const std::string& name, int pp, int m, int vpp) {
  return make_schedule(parse_schedule(name), pp, m, vpp);
}

Schedule afab(int pp, int m) {
  Schedule s = empty_schedule(PipelineSchedule::afab, pp, m, 1, false);
  for (int r = 0; r < pp; ++r) {
    for (int mb = 0; mb < m; ++mb) s.ranks[r].push_back({r, Op::F, mb});
    for (int mb = 0; mb < m; ++mb) s.ranks[r].push_back({r, Op::B, mb});
  }
  return s;
}

Schedule one_f_one_b(int pp, int m) {
  Schedule s = empty_schedule(PipelineSchedule::one_f_one_b, pp, m, 1, false);
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
  Schedule s = empty_schedule(PipelineSchedule::interleaved, pp, m, vpp, false);
  // Megatron order: micro-batches in rounds of at least pp; a round goes
  // through chunk 0, then chunk 1, ... (backward: last chunk first). With m
  // not a multiple of pp there are m / pp rounds and the remainder is spread
  // over them, one extra micro-batch for each of the first m % rounds (as
  // PyTorch's Interleaved1F1B sizes its rounds): the warm-up below covers
  // the first round's chunks, and every later round is no larger, so no
  // backward comes due before its forward (see generators.hpp for why the
  // other placements fail). The warm-up, and so the peak of activations in
  // flight, grows with the first round's size: ceil(m / rounds) is at most
  // what putting the whole remainder into the first round (pp + m % pp)
  // gave, and less where there are two or more rounds (p=4 m=10: 5, not 6).
  std::vector<std::pair<int, int>> fwd, bwd;  // (chunk, micro-batch)
  const int rounds = std::max(1, m / pp);
  int first_group = 0;
  for (int start = 0, i = 0; start < m; ++i) {
    const int end = start + m / rounds + (i < m % rounds ? 1 : 0);
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
  Schedule s = empty_schedule(PipelineSchedule::zb_h1, pp, m, 1, true);
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

Schedule zero_bubble_v(int pp, int m) {
  Schedule s = empty_schedule(PipelineSchedule::zb_v, pp, m, 2, true);
  const int n = std::max(m, 2 * pp - 1);
  for (int r = 0; r < pp; ++r) {
    VRow v(s.ranks[r], s.stage_of(r, 0), s.stage_of(r, 1));
    // Warm-up: chunk-0 forwards until the first micro-batch has come down the
    // V and back up to this rank; chunk 1's first backwards run as soon as
    // each forward is done (B and W right away: nothing to fill yet).
    for (int i = 0; i < 2 * (pp - r) - 1; ++i) v.forward(0);
    for (int i = 0; i < r; ++i) {
      v.forward(1);
      v.forward(0);
    }
    for (int i = 0; i < pp - r; ++i) {
      v.forward(1);
      v.full_backward(1);
    }
    // Steady state: F, B, W on each chunk in turn.
    while (v.f[1] < v.f[0] || v.f[0] < n) {
      if (v.f[0] < n) v.forward(0);
      v.full_backward(0);
      v.forward(1);
      v.full_backward(1);
    }
    // Cool-down: the input gradients first, so they reach the ranks that
    // wait for them; the weight gradients fill the time after.
    for (int i = 0; i < r; ++i) {
      v.row.push_back({v.stage[0], Op::B, v.b[0]++});
      v.row.push_back({v.stage[1], Op::B, v.b[1]++});
    }
    for (int i = 0; i < pp - r; ++i) {
      v.row.push_back({v.stage[0], Op::B, v.b[0]++});
      v.weight_grad(0);
    }
    while (v.w[1] < v.b[1]) v.weight_grad(1);
    while (v.w[0] < v.b[0]) v.weight_grad(0);
  }
  drop_extra_microbatches(s);
  return s;
}

Schedule dual_pipe_v(int pp, int m) {
  Schedule s = empty_schedule(PipelineSchedule::dualpipev, pp, m, 2, true);
  for (int r = 0; r < pp; ++r) {
    VRow v(s.ranks[r], s.stage_of(r, 0), s.stage_of(r, 1));
    // 1-2: forwards down the V, then alternating with chunk 1 from the turn.
    for (int i = 0; i < 2 * (pp - r - 1); ++i) v.forward(0);
    for (int i = 0; i < r + 1; ++i) {
      v.forward(0);
      v.forward(1);
    }
    // 3: chunk 1's first backwards; their W's go straight after (zero bubble).
    for (int i = 0; i < pp - r - 1; ++i) {
      v.input_grad(1);
      v.oldest_deferred_weight_grad();
      v.forward(1);
    }
    dual_pipe_v_steady(v, pp, m, r);
    dual_pipe_v_drain(v, pp, r);
  }
  return s;
}

ClosedForm closed_form_bubble(const std::string& name, int pp, int m, int vpp, double t_f,
                              double t_b, double t_w) {
  ClosedForm c;
  const double p1 = pp - 1;
  if (one_chunk_schedule(name, vpp)) {
    c.ratio = p1 / m;
    c.formula = "(p-1)/m";
  } else if (name == "interleaved") {
    if (m < pp) return c;
    c.ratio = p1 / (static_cast<double>(vpp) * m);
    c.formula = "(p-1)/(v*m)";
  } else if (name == "zb-v" || name == "dualpipev") {
    // Equal costs only: the V's fill and drain then leave p-1 chunk actions
    // idle per rank (the sweep test checks it against the simulator).
    if (m < 2 * pp || t_f != t_b || t_b != t_w) return c;
    c.ratio = p1 / (6.0 * m);
    c.formula = "(p-1)/(6m) (tF=tB=tW)";
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
