// PyTorch's schedule CSV: files written by PyTorch 2.15 import to trident's
// own orders (compute-only and compute+comms, FSDP and WAIT_SEND cells
// noted), PyTorch's RECV (post early, wait at the compute) keeps its
// makespan, a deadlock is named, cells that cannot be read faithfully are
// refused naming the cell, and trident's export imports back to the same
// schedule for every generator.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/parallel/pp/schedule.hpp"
#include "trident/parallel/pp/simulator.hpp"
#include "trident/parallel/pp/torch_csv.hpp"

using namespace trident;
using namespace trident::pp;

namespace {

std::string fixture(const std::string& name) {
  const char* src = std::getenv("TRIDENT_SOURCE_DIR");
  REQUIRE(src != nullptr);
  std::ifstream f(std::string(src) + "/tests/unit/pp/data/torch/" + name);
  REQUIRE(f.good());
  std::stringstream buf;
  buf << f.rdbuf();
  return buf.str();
}

// The cells of each row without PyTorch's idle padding ("").
std::vector<std::vector<std::string>> cells(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  for (const CsvRow& r : read_csv_rows(text)) {
    rows.emplace_back();
    for (const std::string& c : r.cells)
      if (!c.empty()) rows.back().push_back(c);
  }
  return rows;
}

// Imported, lowered when it came without communication, validated.
Schedule imported(const std::string& text, const std::string& name) {
  Schedule s = from_torch_csv(text, name).schedule;
  if (!s.has_comm()) s = lower(s);
  validate(s);
  return s;
}

}  // namespace

TEST_CASE("PyTorch's compute-only files import to trident's own orders", "[pp]") {
  const std::pair<const char*, Schedule> cases[] = {
      {"torch_p2m4_zbv_compute.csv", make_schedule("zb-v", 2, 4, 2)},
      {"torch_p2m4_dualpipev_compute.csv", make_schedule("dualpipev", 2, 4, 2)},
      {"torch_p2m4_interleaved_compute.csv", make_schedule("interleaved", 2, 4, 2)}};
  for (const auto& [file, own] : cases) {
    INFO(file);
    const TorchImport in = from_torch_csv(fixture(file), file);
    CHECK(in.notes.empty());
    CHECK(in.schedule.placement == own.placement);
    CHECK(in.schedule.split_backward == own.split_backward);
    CHECK(in.schedule.ranks == own.ranks);
    // And trident writes it back cell for cell as PyTorch did (less its idle
    // padding), but for the full backwards of DualPipeV outside its slots,
    // written as I then W.
    if (std::string(file) != "torch_p2m4_dualpipev_compute.csv")
      CHECK(cells(to_torch_csv(own)) == cells(fixture(file)));
  }
}

TEST_CASE("PyTorch's compute+comms files keep their meaning", "[pp]") {
  const SimCosts costs{1, 1, 1, 0};
  for (const char* kind : {"zbv", "dualpipev", "interleaved"}) {
    const std::string comms = std::string("torch_p2m4_") + kind + "_comms.csv";
    INFO(comms);
    const TorchImport in = from_torch_csv(fixture(comms), comms);
    REQUIRE(in.notes.size() == 2);  // FSDP cells, WAIT_SEND cells
    CHECK(in.notes[0].find("FSDP") != std::string::npos);
    CHECK(in.notes[1].find("WAIT_SEND") != std::string::npos);
    REQUIRE(in.schedule.has_comm());
    validate(in.schedule);
    const Schedule compute =
        imported(fixture(std::string("torch_p2m4_") + kind + "_compute.csv"), "c.csv");
    // Same compute order per rank as the compute-only file.
    for (int r = 0; r < compute.pp; ++r) {
      std::vector<Action> a, b;
      for (const Action& x : in.schedule.ranks[r])
        if (is_compute(x.op)) a.push_back(x);
      for (const Action& x : compute.ranks[r])
        if (is_compute(x.op)) b.push_back(x);
      CHECK(a == b);
    }
    // PyTorch sends an overlapped slot's outputs after both computes, so
    // DualPipeV's lowered file may only be slower than trident's lowering.
    const double want = simulate(compute, costs).makespan;
    const double got = simulate(in.schedule, costs).makespan;
    if (std::string(kind) == "dualpipev")
      CHECK(got >= want);
    else
      CHECK(got == Approx(want));
  }
}

TEST_CASE("an early RECV is posted early and waited for at its compute", "[pp]") {
  const std::string text = fixture("early_recv.csv");
  const SimCosts costs{1, 2, 1, 0};
  const TorchImport in = from_torch_csv(text, "early_recv.csv");
  validate(in.schedule);
  // Rank 1 posts 1RECV_F1 when it starts 1F0 (where the cell stood)...
  REQUIRE(in.schedule.early_posts.size() == 2);
  CHECK(in.schedule.early_posts[0].size() == 1);  // 0RECV_B1, posted before 0B0's wait
  REQUIRE(in.schedule.early_posts[1].size() == 1);
  CHECK(in.schedule.early_posts[1][0].recv == Action{1, Op::RECV_F, 1});
  // ...and waits for it only before 1F1, so the makespan is 1F1B's own.
  CHECK(simulate(in.schedule, costs).makespan == Approx(12));
  CHECK(simulate(lower(one_f_one_b(2, 2)), costs).makespan == Approx(12));
  // Read as trident's (RECV blocks where it stands) it would be 16.
  CHECK(simulate(from_csv(text, "early_recv.csv"), costs).makespan == Approx(16));
}

TEST_CASE("a deadlocking PyTorch file is named by the simulator", "[pp]") {
  const Schedule s = from_torch_csv(fixture("deadlock.csv"), "deadlock.csv").schedule;
  REQUIRE_NOTHROW(validate(s));
  CHECK_THROWS_WITH(simulate(s, {}), Catch::Contains("deadlock") && Catch::Contains("1RECV_F1") &&
                                         Catch::Contains("0RECV_B0"));
}

TEST_CASE("cells that cannot be imported faithfully are refused naming the cell", "[pp]") {
  CHECK_THROWS_WITH(from_torch_csv("0F0,0X0\n", "x.csv"), Catch::Contains("x.csv:1") &&
                                                              Catch::Contains("'0X0'") &&
                                                              Catch::Contains("unknown action"));
  CHECK_THROWS_WITH(from_torch_csv("0F0,0B0\n1RECV_F0,1B0\n", "r.csv"),
                    Catch::Contains("r.csv:2") && Catch::Contains("'1RECV_F0'") &&
                        Catch::Contains("never runs the forward"));
  CHECK_THROWS_WITH(from_torch_csv("(0F0;0W0)OVERLAP_F_B\n", "o.csv"),
                    Catch::Contains("'(0F0;0W0)OVERLAP_F_B'") && Catch::Contains("one F then"));
  CHECK_THROWS_WITH(from_torch_csv("0F,0B0\n", "m.csv"), Catch::Contains("'0F'"));
  // A stage on two rows.
  CHECK_THROWS_WITH(from_torch_csv("0F0,0B0,1F0\n1F0,1B0\n", "s.csv"),
                    Catch::Contains("belongs to rank"));
}

TEST_CASE("trident's PyTorch export imports back to the same schedule", "[pp]") {
  int checked = 0;
  for (const std::string name : {"afab", "1f1b", "zb-h1", "interleaved", "zb-v", "dualpipev"})
    for (int p : {1, 2, 3, 4})
      for (int m : {1, 2, 5, 8, 9}) {
        const int v = default_vpp(name) == 2 || name == "interleaved" ? 2 : 1;
        if (m < min_microbatches(name, p, v)) continue;
        INFO(name << " p=" << p << " m=" << m);
        const Schedule low = lower(make_schedule(name, p, m, v));
        const Schedule back = imported(to_torch_csv(low), "t.csv");
        CHECK(back.ranks == low.ranks);
        CHECK(back.placement == low.placement);
        CHECK(to_torch_csv(low).find('#') == std::string::npos);  // no header
        ++checked;
      }
  CHECK(checked > 80);
}
