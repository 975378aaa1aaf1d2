// Pipeline schedule tests: every generator over a sweep of (p, m, v) lowers to
// a schedule the simulator runs without deadlock, with each compute exactly
// once in dependency order, the closed-form bubble where one exists, and the
// expected activation memory; CSV round trips; broken hand-written schedules
// are refused with messages naming the actions.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <tuple>

#include "trident/core/error.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/parallel/pp/schedule.hpp"
#include "trident/parallel/pp/simulator.hpp"

using namespace trident;
using namespace trident::pp;

namespace {

struct Case {
  std::string name;
  int p, m, v;
};

// At least 30 combinations, odd p and m included, m below, equal to and above p.
std::vector<Case> sweep() {
  std::vector<Case> cases;
  for (const std::string name : {"afab", "1f1b", "zb-h1"})
    for (int p : {1, 2, 3, 4, 5, 8})
      for (int m : {1, 2, 3, 4, 5, 7, 8, 13, 16}) cases.push_back({name, p, m, 1});
  for (int p : {1, 2, 3, 4, 5, 8})
    for (int v : {2, 3, 4})
      for (int m = 1; m <= 2 * p + 3; ++m) cases.push_back({"interleaved", p, m, v});
  for (int m : {24, 29, 32}) cases.push_back({"interleaved", 8, m, 2});
  // The V schedules: ZB-V for any m, DualPipeV from m = 2p.
  for (int p : {1, 2, 3, 4, 5, 8})
    for (int m : {1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17}) cases.push_back({"zb-v", p, m, 2});
  for (int p : {1, 2, 3, 4, 5, 8})
    for (int m = 2 * p; m <= 2 * p + 9; ++m) cases.push_back({"dualpipev", p, m, 2});
  return cases;
}

Schedule generate(const Case& c) { return make_schedule(c.name, c.p, c.m, c.v); }

std::string describe(const Case& c) {
  return c.name + " p=" + std::to_string(c.p) + " m=" + std::to_string(c.m) +
         " v=" + std::to_string(c.v);
}

// Independent check of the compute content: per rank, each (stage, mb) of the
// rank's chunks has F, B (and W when split) exactly once, in that order.
void check_each_compute_once(const Schedule& s) {
  for (int r = 0; r < s.pp; ++r) {
    std::map<std::tuple<int, int, int>, std::vector<size_t>> where;  // (stage, mb, op) -> positions
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (!is_compute(a.op)) continue;
      REQUIRE(s.rank_of(a.stage) == r);
      where[{a.stage, a.microbatch, static_cast<int>(a.op)}].push_back(i);
    }
    for (int c = 0; c < s.vpp; ++c) {
      const int st = s.stage_of(r, c);
      for (int mb = 0; mb < s.microbatches; ++mb) {
        const auto& f = where[{st, mb, int(Op::F)}];
        const auto& b = where[{st, mb, int(Op::B)}];
        const auto& w = where[{st, mb, int(Op::W)}];
        REQUIRE(f.size() == 1);
        REQUIRE(b.size() == 1);
        REQUIRE(w.size() == (s.split_backward ? 1u : 0u));
        REQUIRE(f[0] < b[0]);
        if (s.split_backward) REQUIRE(b[0] < w[0]);
      }
    }
  }
}

}  // namespace

TEST_CASE("action text form round-trips and bad text is refused", "[pp]") {
  for (Op op : {Op::F, Op::B, Op::W, Op::SEND_F, Op::RECV_F, Op::SEND_B, Op::RECV_B}) {
    Action a{12, op, 307};
    CHECK(parse_action(a.str(), "t") == a);
  }
  CHECK(Action{1, Op::F, 3}.str() == "1F3");
  CHECK(Action{0, Op::SEND_B, 2}.str() == "0SEND_B2");
  CHECK_THROWS_AS(parse_action("F3", "t"), InputError);
  CHECK_THROWS_AS(parse_action("1X3", "t"), InputError);
  CHECK_THROWS_AS(parse_action("1F", "t"), InputError);
  CHECK_THROWS_WITH(parse_action("1SEND3", "f.csv:2"),
                    Catch::Contains("f.csv:2") && Catch::Contains("1SEND3"));
}

TEST_CASE("sweep: every schedule lowers and simulates without deadlock", "[pp]") {
  const auto cases = sweep();
  REQUIRE(cases.size() >= 30);
  const SimCosts unit{1, 2, 1, 0};
  const SimCosts odd{1, 1.5, 0.75, 0};     // non-integer costs; tW < tF + tB
  const SimCosts equal{0.5, 0.5, 0.5, 0};  // the V schedules' closed form
  int closed_checked = 0;
  for (const Case& c : cases) {
    INFO(describe(c));
    const Schedule compute = generate(c);
    REQUIRE(!compute.has_comm());
    check_each_compute_once(compute);
    const Schedule low = lower(compute);
    check_each_compute_once(low);
    REQUIRE_NOTHROW(validate(low));
    // Every SEND is matched by exactly one RECV on the peer rank.
    int sends = 0, recvs = 0;
    for (const auto& row : low.ranks)
      for (const auto& a : row) {
        sends += a.op == Op::SEND_F || a.op == Op::SEND_B;
        recvs += a.op == Op::RECV_F || a.op == Op::RECV_B;
      }
    // Stage pairs on different ranks: all but the V's turn (and none for p = 1).
    const bool v_shape = c.name == "zb-v" || c.name == "dualpipev";
    const int boundaries = c.p > 1 ? c.p * c.v - 1 - (v_shape ? 1 : 0) : 0;
    int remote_pairs = 0;
    for (int st = 0; st + 1 < low.num_stages(); ++st)
      remote_pairs += low.rank_of(st) != low.rank_of(st + 1);
    CHECK(remote_pairs == boundaries);
    CHECK(sends == 2 * boundaries * c.m);
    CHECK(recvs == sends);

    for (const SimCosts& costs : {unit, odd, equal}) {
      SimResult sim;
      REQUIRE_NOTHROW(sim = simulate(low, costs));
      // Busy time is fixed by the work; the makespan cannot beat it.
      const double work = c.m * c.v * (costs.t_f + costs.t_b + costs.t_w);
      for (const auto& rr : sim.ranks) {
        CHECK(rr.busy == Approx(work).epsilon(1e-12));
        CHECK(sim.makespan >= work - 1e-9);
      }
      const ClosedForm cf =
          closed_form_bubble(c.name, c.p, c.m, c.v, costs.t_f, costs.t_b, costs.t_w);
      if (cf.exists()) {
        ++closed_checked;
        // Every rank idles the same amount in these schedules.
        for (const auto& rr : sim.ranks)
          CHECK(rr.bubble_fraction == Approx(cf.fraction).margin(1e-12));
      }
    }
  }
  CHECK(closed_checked > 100);
}

TEST_CASE("closed forms exist where the literature gives one", "[pp]") {
  CHECK(closed_form_bubble("1f1b", 4, 8, 1, 1, 2, 1).ratio == Approx(3.0 / 8));
  CHECK(closed_form_bubble("afab", 4, 8, 1, 1, 2, 1).fraction == Approx(3.0 / 11));
  CHECK(closed_form_bubble("interleaved", 4, 8, 2, 1, 2, 1).ratio == Approx(3.0 / 16));
  // Any m >= p (the sweep checks it against the simulator); none below.
  CHECK(closed_form_bubble("interleaved", 4, 9, 2, 1, 2, 1).ratio == Approx(3.0 / 18));
  CHECK_FALSE(closed_form_bubble("interleaved", 4, 3, 2, 1, 2, 1).exists());
  // ZB-V and DualPipeV with equal costs: p-1 idle chunk actions per rank
  // (torch's ZB-V at p = 4, m = 8: 3/51 = 0.0588 of the makespan).
  CHECK(closed_form_bubble("zb-v", 4, 8, 2, 1, 1, 1).fraction == Approx(3.0 / 51));
  CHECK(closed_form_bubble("dualpipev", 4, 8, 2, 1, 1, 1).fraction == Approx(3.0 / 51));
  CHECK_FALSE(closed_form_bubble("zb-v", 4, 8, 2, 1, 2, 1).exists());
  CHECK_FALSE(closed_form_bubble("zb-v", 4, 7, 2, 1, 1, 1).exists());
  // ZB-H1 with tF = tB = tW: a third of 1F1B's bubble time.
  CHECK(closed_form_bubble("zb-h1", 4, 8, 1, 1, 1, 1).ratio ==
        Approx(closed_form_bubble("1f1b", 4, 8, 1, 1, 1, 1).ratio / 3));
}

TEST_CASE("peak in-flight activations: AFAB holds m, 1F1B and ZB-H1 at most p", "[pp]") {
  for (int p : {2, 3, 4, 8})
    for (int m : {1, 3, 4, 8, 13}) {
      INFO("p=" << p << " m=" << m);
      const auto a = simulate(lower(afab(p, m)), {});
      const auto o = simulate(lower(one_f_one_b(p, m)), {});
      const auto z = simulate(lower(zero_bubble_h1(p, m)), {});
      for (int r = 0; r < p; ++r) {
        CHECK(a.ranks[r].peak_inflight == m);
        CHECK(o.ranks[r].peak_inflight == std::min(p - r, m));
        CHECK(z.ranks[r].peak_inflight <= std::min(p, m));
      }
      CHECK(z.max_peak_inflight() == std::min(p, m));
    }
}

TEST_CASE("interleaved beats 1F1B's bubble and ZB-H1 beats 1F1B", "[pp]") {
  const SimCosts c{1, 1, 1, 0};
  for (int m : {4, 5, 8, 11, 16}) {
    INFO("m=" << m);
    const double one = simulate(lower(one_f_one_b(4, m)), c).mean_bubble();
    CHECK(simulate(lower(zero_bubble_h1(4, m)), c).mean_bubble() < one);
    // Same total work per rank when each chunk costs half as much.
    const SimCosts half{0.5, 0.5, 0.5, 0};
    CHECK(simulate(lower(interleaved_one_f_one_b(4, m, 2)), half).mean_bubble() < one);
  }
}

TEST_CASE("the simulator prices the EP exchange an overlapped F+B slot hides", "[pp][overlap]") {
  SimCosts plain{1, 2, 1, 0};
  SimCosts ep = plain;
  ep.e_f = 0.5;  // of the F's 1: its compute is 0.5
  ep.e_b = 0.5;  // of the B's 2: its compute is 1.5
  SimCosts serial = ep;
  serial.overlap_pairs = false;
  const Schedule d = lower(make_schedule("dualpipev", 4, 10, 2));
  const SimResult p = simulate(d, plain), o = simulate(d, ep), s = simulate(d, serial);
  // Run serially the exchange is already inside tF and tB: nothing changes.
  CHECK(s.makespan == p.makespan);
  CHECK(o.makespan < s.makespan);
  auto slots = [&](int r) {  // overlapped F+B slots on rank r (F and B on different chunks)
    int n = 0;
    for (const Action& a : d.ranks[size_t(r)]) n += a.op == Op::F && a.overlapped ? 1 : 0;
    return n;
  };
  for (int r = 0; r < d.pp; ++r) {
    INFO("rank " << r);
    CHECK(slots(r) > 0);
    // each slot hides min(0.5, 1.5) of the F's exchange and min(0.5, 0.5) of the B's
    CHECK(s.ranks[size_t(r)].busy - o.ranks[size_t(r)].busy == Approx(1.0 * slots(r)));
  }
  // A schedule without overlapped slots is priced as before.
  const Schedule z = lower(make_schedule("zb-v", 4, 10, 2));
  CHECK(simulate(z, ep).makespan == simulate(z, plain).makespan);
  // An exchange hides behind at most the other lane's compute.
  SimCosts big = plain;
  big.e_f = 1.0;  // the F is all exchange: the B's compute 1.5 hides all of it
  big.e_b = 0.5;  // the F has no compute to hide the B's behind
  CHECK(p.ranks[0].busy - simulate(d, big).ranks[0].busy == Approx(1.0 * slots(0)));
}

namespace {

// Interleaved as trident generated it before rounds were balanced: rounds of
// pp, the whole remainder m % pp in the first one (what the peak check below
// compares the bubble with).
Schedule remainder_first_interleaved(int pp, int m, int vpp) {
  Schedule s = make_schedule("interleaved", pp, m, vpp);
  std::vector<std::pair<int, int>> fwd, bwd;
  int first = 0;
  for (int start = 0; start < m;) {
    const int end = std::min(m, start == 0 ? pp + m % pp : start + pp);
    for (int c = 0; c < vpp; ++c)
      for (int mb = start; mb < end; ++mb) fwd.push_back({c, mb});
    for (int c = vpp - 1; c >= 0; --c)
      for (int mb = start; mb < end; ++mb) bwd.push_back({c, mb});
    if (start == 0) first = end;
    start = end;
  }
  const int total = m * vpp;
  for (int r = 0; r < pp; ++r) {
    const int warmup = std::min(total, (pp - r - 1) * 2 + (vpp - 1) * first);
    auto& row = s.ranks[size_t(r)];
    row.clear();
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

}  // namespace

TEST_CASE("interleaved holds no more activations than PyTorch's Interleaved1F1B", "[pp]") {
  // The cases: PyTorch 2.15 peaks at 12 (p=4 m=10) and 25 (p=8 m=20).
  CHECK(simulate(lower(make_schedule("interleaved", 4, 10, 2)), SimCosts{1, 1, 1, 0})
            .max_peak_inflight() == 12);
  CHECK(simulate(lower(make_schedule("interleaved", 8, 20, 2)), SimCosts{1, 1, 1, 0})
            .max_peak_inflight() == 25);
  for (int p : {2, 3, 4, 5, 8})
    for (int v : {2, 3, 4})
      for (int m = p; m <= 3 * p + 1; ++m) {
        INFO("p=" << p << " v=" << v << " m=" << m);
        const Schedule s = make_schedule("interleaved", p, m, v);
        validate(lower(s));
        // PyTorch: rounds = m / p, warm-up (v-1) m/rounds + 2 (p-1-rank); it
        // takes only m that the rounds divide.
        const int rounds = std::max(1, m / p);
        const int torch_peak = std::min(m * v, (v - 1) * (m / rounds) + 2 * (p - 1) + 1);
        for (const SimCosts& c : {SimCosts{1, 1, 1, 0}, SimCosts{1, 2, 1, 0.1}}) {
          const SimResult now = simulate(lower(s), c);
          const SimResult before = simulate(lower(remainder_first_interleaved(p, m, v)), c);
          if (m % rounds == 0) CHECK(now.max_peak_inflight() <= torch_peak);
          CHECK(now.max_peak_inflight() <= before.max_peak_inflight());
          // the same bubble as the order with the remainder in the first round
          CHECK(now.makespan <= before.makespan + 1e-9);
        }
      }
}

TEST_CASE("an uneven layout costs each stage its layers", "[pp]") {
  const Schedule s = lower(one_f_one_b(2, 4));
  const SimCosts c{1, 1, 1, 0};
  const std::vector<double> uneven = stage_work_of_layout({1, 3});  // 0.5 and 1.5 of the mean
  CHECK(uneven == std::vector<double>{0.5, 1.5});
  const double even = simulate(s, c).makespan;
  CHECK(simulate(s, c, stage_work_of_layout({2, 2})).makespan == Approx(even));
  // The slow stage sets the pace: 4 micro-batches of its F (1.5) and B (3),
  // after stage 0's first forward (0.5) and before its last backward (1).
  CHECK(simulate(s, c, uneven).makespan == Approx(0.5 + 4 * 4.5 + 1.0));
  CHECK(simulate(s, c, uneven).makespan > even);
  CHECK_THROWS(simulate(s, c, {1.0, 1.0, 1.0}));
}

TEST_CASE("latency adds two hops per pipeline boundary to AFAB's makespan", "[pp]") {
  const SimCosts c{1, 2, 1, 0.25};
  for (int p : {2, 3, 5})
    for (int m : {1, 4, 7}) {
      const auto sim = simulate(lower(afab(p, m)), c);
      const double tfb = c.t_f + c.t_b + c.t_w;
      CHECK(sim.makespan == Approx(m * tfb + (p - 1) * (tfb + 2 * c.latency)));
    }
}

TEST_CASE("rules: bad parameters are InputErrors naming the flag", "[pp]") {
  CHECK_THROWS_WITH(make_schedule("interleaved", 4, 0, 2), Catch::Contains("--microbatches"));
  CHECK_THROWS_WITH(make_schedule("1f1b", 4, 8, 2), Catch::Contains("--vpp"));
  CHECK_THROWS_WITH(make_schedule("zb-h1", 4, 8, 2), Catch::Contains("--vpp"));
  CHECK_THROWS_WITH(make_schedule("zb-h3", 4, 8, 1), Catch::Contains("zb-h3"));
  CHECK_THROWS_WITH(make_schedule("1f1b", 0, 8, 1), Catch::Contains("--pp"));
  CHECK_THROWS_WITH(make_schedule("afab", 2, 0, 1), Catch::Contains("--microbatches"));
  // Interleaved takes any micro-batch count, as its generator does.
  CHECK(min_microbatches("interleaved", 4, 2) == 1);
  CHECK_NOTHROW(make_schedule("interleaved", 4, 3, 2));
  CHECK_NOTHROW(make_schedule("interleaved", 4, 6, 2));
  CHECK(make_schedule("interleaved", 4, 6, 2).ranks == interleaved_one_f_one_b(4, 6, 2).ranks);
  // The V schedules hold two chunks per rank; DualPipeV needs m >= 2p.
  CHECK_THROWS_WITH(make_schedule("zb-v", 4, 8, 1),
                    Catch::Contains("--vpp 1") && Catch::Contains("--vpp 2"));
  CHECK_THROWS_WITH(make_schedule("dualpipev", 4, 8, 3), Catch::Contains("--vpp 3"));
  CHECK_THROWS_WITH(make_schedule("dualpipev", 4, 7, 2),
                    Catch::Contains("--microbatches 7") && Catch::Contains("at least 8"));
  CHECK(min_microbatches("dualpipev", 3, 2) == 6);
  CHECK(min_microbatches("zb-v", 3, 2) == 1);
  CHECK(default_vpp("zb-v") == 2);
  CHECK(default_vpp("1f1b") == 1);
  CHECK(min_microbatches("1f1b", 8, 1) == 1);
  CHECK_THROWS_AS(min_microbatches("nope", 4, 1), InputError);
}

TEST_CASE("CSV export and import round-trip every generated schedule", "[pp]") {
  for (const Case& c : sweep()) {
    INFO(describe(c));
    const Schedule low = lower(generate(c));
    const Schedule back = from_csv(to_csv(low), "x.csv");
    CHECK(back.pp == low.pp);
    CHECK(back.vpp == low.vpp);
    CHECK(back.microbatches == low.microbatches);
    CHECK(back.split_backward == low.split_backward);
    CHECK(back.ranks == low.ranks);
  }
}

TEST_CASE("a hand-written deadlocking schedule is refused naming the waiting actions", "[pp]") {
  // Rank 0 wants micro-batch 0's gradient before it sends micro-batch 1
  // forward; rank 1 wants micro-batch 1's input before it runs that backward.
  const std::string csv =
      "# two ranks waiting on each other\n"
      "0F0,0B0,0F1,0B1\n"
      "1F0,1F1,1B0,1B1\n";
  const Schedule low = lower(from_csv(csv, "dead.csv"));
  REQUIRE_NOTHROW(validate(low));  // locally consistent: only the simulator can see it
  CHECK_THROWS_WITH(simulate(low, {}), Catch::Contains("deadlock") && Catch::Contains("0RECV_B0") &&
                                           Catch::Contains("1SEND_B0") &&
                                           Catch::Contains("1RECV_F1") &&
                                           Catch::Contains("0SEND_F1"));
}

TEST_CASE("incomplete or inconsistent hand-written schedules are refused", "[pp]") {
  // A missing B.
  CHECK_THROWS_WITH(validate(from_csv("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", "m.csv")),
                    Catch::Contains("0B1") && Catch::Contains("missing"));
  // A missing W in a split schedule.
  CHECK_THROWS_WITH(validate(from_csv("0F0,0B0,0W0,0F1,0B1\n1F0,1B0,1W0,1F1,1B1,1W1\n", "w.csv")),
                    Catch::Contains("0W1"));
  // B before F on a rank.
  CHECK_THROWS_WITH(validate(from_csv("0B0,0F0\n1F0,1B0\n", "o.csv")), Catch::Contains("before"));
  // ... with the rank's order, the faulty actions bracketed (one line).
  CHECK_THROWS_WITH(validate(from_csv("0B0,0F0\n1F0,1B0\n", "o.csv")),
                    Catch::Contains("0B0 runs before 0F0 (rank 0: [0B0] [0F0])"));
  {
    // Far apart: a window around each, "..." between and after.
    std::string r0 = "0B0", r1;
    for (int mb = 1; mb < 10; ++mb) r0 += ",0F" + std::to_string(mb);
    r0 += ",0F0";
    for (int mb = 1; mb < 10; ++mb) r0 += ",0B" + std::to_string(mb);
    for (int mb = 0; mb < 10; ++mb)
      r1 += (mb ? ",1F" : "1F") + std::to_string(mb) + ",1B" + std::to_string(mb);
    CHECK_THROWS_WITH(validate(from_csv(r0 + "\n" + r1 + "\n", "far.csv")),
                      Catch::EndsWith("0B0 runs before 0F0 (rank 0: [0B0] 0F1 0F2 0F3 ... 0F7 0F8 "
                                      "0F9 [0F0] 0B1 0B2 0B3 ...)"));
  }
  // A stage on the wrong rank.
  CHECK_THROWS_WITH(validate(from_csv("0F0,0B0,1F0,1B0\n1F0,1B0\n", "r.csv")),
                    Catch::Contains("belongs to rank"));
  // Duplicates.
  CHECK_THROWS_WITH(validate(from_csv("0F0,0F0,0B0\n1F0,1B0\n", "d.csv")),
                    Catch::Contains("rank 0: 0F0 appears twice ([0F0] [0F0] 0B0)"));
  // A lowered schedule whose receive has no send.
  Schedule low = lower(one_f_one_b(2, 2));
  auto& row0 = low.ranks[0];
  row0.erase(std::find(row0.begin(), row0.end(), Action{0, Op::SEND_F, 1}));
  CHECK_THROWS_WITH(validate(low), Catch::Contains("0SEND_F1"));
  // A lowered schedule whose F runs before its receive.
  Schedule early = lower(one_f_one_b(2, 2));
  auto& row1 = early.ranks[1];
  std::swap(row1[0], row1[1]);
  CHECK_THROWS_WITH(validate(early), Catch::Contains("1RECV_F0"));
}

TEST_CASE("ASCII timeline draws one row per rank, one cell per time unit", "[pp]") {
  const Schedule s = lower(one_f_one_b(4, 8));
  const auto sim = simulate(s, {1, 2, 1, 0});
  const std::string t = format_timeline(s, sim);
  CHECK(sim.makespan == Approx((8 + 3) * 4));
  // Rank 0 idles from 4 to 13 while micro-batch 0 goes down and its gradient comes back.
  std::string idle;
  for (int i = 0; i < 9; ++i) idle += ".  ";
  CHECK(t.find("rank 0 |F0 F1 F2 F3 " + idle + "B0 B0 B0 F4") != std::string::npos);
  CHECK(t.find("rank 3 |.  .  .  F0 B0 B0 B0 F1") != std::string::npos);
}
