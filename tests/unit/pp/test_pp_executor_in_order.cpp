// The pipeline executor on a communicator with NCCL's point-to-point
// semantics (tests/support/in_order_comm.hpp: one in-order stream per rank,
// rendezvous, no tags), ranks as threads: every schedule must run without a
// deadlock and deliver every boundary tensor to the right stage. MPI's tag
// matching hides a posting order that NCCL cannot run (an early RECV_B
// holding the stream in front of the rank's next SEND_F), so the MPI parity
// tests cannot catch it; this test does, without a GPU.
#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../../support/in_order_comm.hpp"
#include "trident/core/error.hpp"
#include "trident/parallel/pp/executor.hpp"
#include "trident/parallel/pp/generators.hpp"

using namespace trident;
using namespace trident::pp;
using trident::test::InOrderComm;
using trident::test::InOrderWorld;

namespace {

// Writes values that name (stage, micro-batch, element, direction) and
// checks that what arrives is what the neighbour stage wrote.
class TaggedStage final : public PipelineStage {
 public:
  TaggedStage(const Schedule& s, int rank) : s_(s), rank_(rank) {}
  int64_t boundary_numel(int chunk, int mb) override { return 2 + mb % 3 + chunk; }
  void forward(int chunk, int mb, const Tensor& in, Tensor& out) override {
    const int st = s_.stage_of(rank_, chunk);
    if (st > 0) check(in, st - 1, mb, false, "F");
    if (!out.empty()) fill(out, st, mb, false);
  }
  void backward(int chunk, int mb, const Tensor& gout, Tensor& gin, bool) override {
    const int st = s_.stage_of(rank_, chunk);
    if (s_.forward_only) errors += "B of stage " + std::to_string(st) + " in a forward-only run; ";
    if (st < s_.num_stages() - 1) check(gout, st + 1, mb, true, "B");
    if (!gin.empty()) fill(gin, st, mb, true);
  }
  void backward_weight(int, int) override {}
  void discard_forward(int chunk, int mb) override {
    if (!s_.forward_only) errors += "a forward discarded in a training run; ";
    forwards_discarded.push_back({s_.stage_of(rank_, chunk), mb});
  }
  std::string errors;
  std::vector<std::pair<int, int>> forwards_discarded;  // (stage, micro-batch), in order

 private:
  static float value(int st, int mb, int64_t i, bool bwd) {
    const float v = float(st * 1000 + mb * 10 + int(i)) + 0.5f;
    return bwd ? -v : v;
  }
  void fill(Tensor& t, int st, int mb, bool bwd) {
    for (int64_t i = 0; i < t.numel(); ++i) t.ptr()[i] = value(st, mb, i, bwd);
  }
  void check(const Tensor& t, int from, int mb, bool bwd, const char* what) {
    bool ok = !t.empty();
    for (int64_t i = 0; ok && i < t.numel(); ++i) ok = t.ptr()[i] == value(from, mb, i, bwd);
    if (!ok)
      errors += std::string(what) + " of micro-batch " + std::to_string(mb) + " on rank " +
                std::to_string(rank_) + " got the wrong data; ";
  }
  const Schedule& s_;
  int rank_;
};

// Runs every rank of s on its own thread; returns the ranks' errors.
// discarded: each rank's forwards as discard_forward saw them.
std::string run_threads(const Schedule& s, double timeout_s,
                        std::vector<std::vector<std::pair<int, int>>>* discarded = nullptr) {
  InOrderWorld world(s.pp);
  std::vector<std::string> errors(size_t(s.pp));
  if (discarded) discarded->assign(size_t(s.pp), {});
  std::vector<std::thread> threads;
  for (int r = 0; r < s.pp; ++r)
    threads.emplace_back([&, r] {
      try {
        InOrderComm comm(world, r, timeout_s);
        TaggedStage stage(s, r);
        execute(s, r, stage, comm, 0, nullptr);
        errors[size_t(r)] = stage.errors;
        if (discarded) (*discarded)[size_t(r)] = stage.forwards_discarded;
      } catch (const std::exception& e) {
        errors[size_t(r)] = std::string("rank ") + std::to_string(r) + ": " + e.what();
      }
    });
  for (auto& t : threads) t.join();
  std::string all;
  for (const auto& e : errors)
    if (!e.empty()) all += e + "\n";
  return all;
}

}  // namespace

TEST_CASE("the in-order model deadlocks where NCCL does and runs grouped pairs", "[pp][comm]") {
  // Both ranks send first: on NCCL each send waits for a receive that is
  // queued behind the other rank's send.
  auto exchange = [](bool grouped) {
    InOrderWorld world(2);
    std::vector<std::string> err(2);
    std::vector<float> got(2, 0.0f);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          InOrderComm c(world, r, 0.5);
          float mine = float(r + 1);
          if (grouped) c.begin_group();
          Request s = c.isend(&mine, sizeof mine, 1 - r, 0);
          Request q = c.irecv(&got[size_t(r)], sizeof(float), 1 - r, 0);
          if (grouped) c.end_group();
          c.wait(q);
          c.wait(s);
        } catch (const std::exception& e) {
          err[size_t(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    return std::make_pair(err, got);
  };
  const auto [blocked, unused] = exchange(false);
  CHECK(blocked[0].find("timed out") != std::string::npos);
  CHECK(blocked[1].find("timed out") != std::string::npos);
  const auto [ok, got] = exchange(true);
  CHECK(ok[0].empty());
  CHECK(ok[1].empty());
  CHECK(got == std::vector<float>{2.0f, 1.0f});
}

TEST_CASE("the in-order model rejects messages posted in different orders", "[pp][comm]") {
  InOrderWorld world(2);
  std::string err0, err1;
  std::thread t0([&] {
    try {
      InOrderComm c(world, 0, 2.0);
      float a = 1, b = 2;
      Request s1 = c.isend(&a, 4, 1, 1);
      Request s2 = c.isend(&b, 4, 1, 2);
      c.wait(s1);
      c.wait(s2);
    } catch (const std::exception& e) {
      err0 = e.what();
    }
  });
  std::thread t1([&] {
    try {
      InOrderComm c(world, 1, 2.0);
      float a = 0, b = 0;
      Request r2 = c.irecv(&b, 4, 0, 2);
      Request r1 = c.irecv(&a, 4, 0, 1);
      c.wait(r2);
      c.wait(r1);
    } catch (const std::exception& e) {
      err1 = e.what();
    }
  });
  t0.join();
  t1.join();
  CHECK(err1.find("different orders") != std::string::npos);
}

TEST_CASE("every schedule runs on in-order point-to-point without a deadlock", "[pp][comm]") {
  for (const std::string& name : schedule_names())
    for (int p : {2, 3, 4}) {
      const int vmax = name == "interleaved" ? 3 : 1;
      for (int v = 1; v <= vmax; ++v) {
        const int vpp = name == "interleaved" ? v : default_vpp(name);
        for (int m : {1, 2, p, p + 1, 2 * p, 2 * p + 1}) {
          if (m < min_microbatches(name, p, vpp)) continue;
          if (name == "interleaved" && vpp == 1) continue;
          const Schedule s = lower(make_schedule(name, p, m, vpp));
          INFO(name << " pp=" << p << " vpp=" << vpp << " m=" << m);
          CHECK(run_threads(s, 5.0) == "");
        }
      }
    }
}

TEST_CASE("forward-only schedules run each forward once, in the schedule's order, and nothing else",
          "[pp][comm]") {
  for (const std::string& name : schedule_names())
    for (int p : {1, 2, 4}) {
      const int vpp = name == "interleaved" ? 2 : default_vpp(name);
      for (int m : {p, 2 * p + 1}) {
        if (m < min_microbatches(name, p, vpp)) continue;
        if (name == "interleaved" && p == 1) continue;
        INFO(name << " pp=" << p << " vpp=" << vpp << " m=" << m);
        const Schedule compute = make_schedule(name, p, m, vpp);
        const Schedule fwd = lower(forward_only_of(compute));
        REQUIRE_NOTHROW(validate(fwd));
        std::vector<std::vector<std::pair<int, int>>> discarded;
        CHECK(run_threads(fwd, 5.0, &discarded) == "");
        for (int r = 0; r < p; ++r) {
          // the forwards in the training schedule's order on that rank
          std::vector<std::pair<int, int>> want;
          for (const Action& a : compute.ranks[size_t(r)])
            if (a.op == Op::F) want.push_back({a.stage, a.microbatch});
          CHECK(discarded[size_t(r)] == want);
          for (const Action& a : fwd.ranks[size_t(r)])
            CHECK((a.op == Op::F || a.op == Op::SEND_F || a.op == Op::RECV_F));
        }
      }
    }
  // a backward in a forward-only schedule is refused with one line naming it
  Schedule bad = forward_only_of(make_schedule("1f1b", 2, 2, 1));
  bad.ranks[1].push_back(Action{1, Op::B, 0});
  CHECK_THROWS_WITH(validate(bad), Catch::Contains("1B0") &&
                                       Catch::Contains("forward-only schedule holds only F"));
}
