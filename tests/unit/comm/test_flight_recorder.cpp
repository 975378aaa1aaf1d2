// The flight recorder's ring (comm/flight_recorder.hpp), filled through the
// Communicator's common part over a backend without MPI: the last N
// operations kept oldest first with kind, group, peer, tag, bytes and their
// number in the group; states and times as they happen; a wait past its
// deadline marked and written; the file's contents; off at capacity 0.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "trident/comm/flight_recorder.hpp"
#include "trident/core/error.hpp"

using namespace trident;

namespace {

// An operation that completes on its first poll, or never.
class FixedOp final : public PendingOp {
 public:
  explicit FixedOp(bool done) : done_(done) {}
  bool poll() override { return done_; }

 private:
  bool done_;
};

// Rank 2 of a dp group of world ranks {10, 11, 12, 13}; a receive with tag
// 99 never completes, everything else at once.
class InstantComm final : public Communicator {
 public:
  explicit InstantComm(double timeout_s)
      : Communicator(CommKind::dp, "dp test", timeout_s, 2, {10, 11, 12, 13}) {}
  const char* backend_name() const override { return "instant"; }
  Device device() const override { return Device::cpu(); }
  int max_tag() const override { return 32767; }
  Communicator& host() override { return *this; }
  std::unique_ptr<Communicator> split(int, int, CommKind, std::string) override { return nullptr; }
  std::unique_ptr<Communicator> split_node(CommKind, std::string) override { return nullptr; }

 protected:
  std::unique_ptr<PendingOp> post(const CommOp& o) override {
    return std::make_unique<FixedOp>(!(o.kind == CommOp::Kind::recv && o.tag == 99));
  }
  size_t max_elements_per_reduction() const override { return 1000; }
};

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("the ring keeps the last N operations, oldest first, as posted", "[comm][flight]") {
  flight_configure(4);
  InstantComm c(5.0);
  char buf[64];
  double x[3] = {1, 2, 3};
  c.barrier();                         // collective #0, dropped from the ring below
  c.allreduce_sum(x, 3);               // collective #1
  Request s = c.isend(buf, 64, 1, 7);  // point-to-point #0, to world rank 11
  c.wait(s);
  c.broadcast(buf, 16, 3);             // collective #2, root world rank 13
  Request r = c.irecv(buf, 32, 0, 5);  // point-to-point #1, posted, not waited on yet
  const std::vector<FlightOp> ops = flight_snapshot();
  REQUIRE(ops.size() == 4);
  CHECK(ops[0].kind == CommOp::Kind::allreduce);
  CHECK(ops[0].seq == 1);
  CHECK(ops[0].bytes == 3 * sizeof(double));
  CHECK(ops[0].peer == -1);
  CHECK(ops[1].kind == CommOp::Kind::send);
  CHECK(ops[1].seq == 0);
  CHECK(ops[1].peer == 11);
  CHECK(ops[1].tag == 7);
  CHECK(ops[1].bytes == 64);
  CHECK(ops[2].kind == CommOp::Kind::broadcast);
  CHECK(ops[2].seq == 2);
  CHECK(ops[2].peer == 13);
  CHECK(ops[3].kind == CommOp::Kind::recv);
  CHECK(ops[3].seq == 1);
  CHECK(ops[3].peer == 10);
  for (size_t i = 0; i + 1 < ops.size(); ++i) {
    CHECK(ops[i].id + 1 == ops[i + 1].id);
    CHECK(ops[i].group == ops[3].group);
    CHECK(ops[i].state == FlightState::completed);
    CHECK(ops[i].posted <= ops[i].waiting);
    CHECK(ops[i].waiting <= ops[i].completed);
  }
  CHECK(ops[3].state == FlightState::posted);
  CHECK(ops[3].waiting < 0);
  CHECK(c.test(r));
  CHECK(flight_snapshot()[3].state == FlightState::completed);
}

TEST_CASE("a wait past its deadline is marked and written to the rank's file", "[comm][flight]") {
  flight_configure(8);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("flight-test-" + std::to_string(::getpid())))
          .string();
  std::vector<std::string> hosts(13, "other");
  hosts[12] = "node-12";
  flight_set_output(dir, 12, hosts);
  InstantComm c(0.1);
  char buf[8];
  c.barrier();
  Request r = c.irecv(buf, 8, 1, 99);
  CHECK_THROWS_AS(c.wait(r), TimeoutError);
  const std::vector<FlightOp> ops = flight_snapshot();
  REQUIRE(ops.size() == 2);
  CHECK(ops[1].state == FlightState::timed_out);
  CHECK(ops[1].waiting >= ops[1].posted);
  CHECK(ops[1].completed < 0);
  const std::string text = read_text(dir + "/rank00012.json");
  CHECK(text.find("\"format\": \"trident-flight\", \"version\": 1") != std::string::npos);
  CHECK(text.find("\"reason\": \"rank 12: recv of 8 B from rank 1 (world 11, tag 99) on dp test "
                  "timed out\"") != std::string::npos);
  CHECK(text.find("{\"kind\": \"dp\", \"name\": \"dp test\", \"rank\": 2, \"members\": [10, 11, "
                  "12, 13]}") != std::string::npos);
  CHECK(text.find("\"kind\": \"recv\"") != std::string::npos);
  CHECK(text.find("\"state\": \"timed_out\"") != std::string::npos);
  CHECK(text.find("\"completed\": null") != std::string::npos);
  CHECK(text.find("\"rank\": 12, \"world_size\": 13, \"host\": \"node-12\"") != std::string::npos);
  std::filesystem::remove_all(dir);
  flight_set_output("", 0, {});
}

TEST_CASE("capacity 0 records nothing and writes nothing", "[comm][flight]") {
  flight_configure(0);
  InstantComm c(1.0);
  c.barrier();
  CHECK(flight_snapshot().empty());
  CHECK_FALSE(flight_dump("test"));
}

TEST_CASE("the folder of a run file's records", "[comm][flight]") {
  CHECK(flight_dir_of("out/run.h5") == "out/run.flight");
  CHECK(flight_dir_of("run") == "run.flight");
}

// Not run by ctest (hidden tag): the cost of recording, for faults.md.
//   build/tests/unit/comm/test_flight_recorder "[bench]"
TEST_CASE("what recording costs per operation", "[.][bench]") {
  InstantComm c(5.0);
  char buf[8];
  double per_op[2] = {0, 0};
  for (int capacity : {0, 256}) {
    flight_configure(capacity);
    const int n = 2000000;
    const double t0 = monotonic_s();
    for (int i = 0; i < n; ++i) {
      Request r = c.isend(buf, 8, 1, 1);
      c.wait(r);
    }
    per_op[capacity ? 1 : 0] = (monotonic_s() - t0) / n;
  }
  std::printf("isend + wait through the common part: %.1f ns off, %.1f ns with a ring of 256\n",
              per_op[0] * 1e9, per_op[1] * 1e9);
}
