// Machine profiles: a good file reads back with SI units, the shipped
// reference profiles read, writing and reading again is the identity, and
// every bad file is refused with one line naming the file, line and key.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "trident/core/error.hpp"
#include "trident/plan/machine.hpp"

using namespace trident;
using namespace trident::plan;

namespace {

const char* kGood = R"(
[machine]
name = "test box"
memory_gb = 80
cores_per_node = 2
[compute]
gemm_tflops = 500
attention_tflops = 300
memory_gb_per_s = 2000
peak_tflops = 989
[link.nvlink]
bandwidth_gb_per_s = 400
latency_us = 3
[link.node]
bandwidth_gb_per_s = 100
latency_us = 5
[link.network]
bandwidth_gb_per_s = 50
latency_us = 10
[overhead]
step_us = 250
)";

std::string refusal(const std::string& text) {
  try {
    parse_machine_text(text, "box.toml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("a machine profile reads in SI units") {
  const MachineProfile m = parse_machine_text(kGood, "box.toml");
  CHECK(m.name == "test box");
  CHECK(m.memory_bytes == Approx(80e9));
  CHECK(m.cores_per_node == 2);
  CHECK(m.gemm_flops == Approx(500e12));
  CHECK(m.attention_flops == Approx(300e12));
  CHECK(m.memory_Bps == Approx(2000e9));
  CHECK(m.peak_flops == Approx(989e12));
  CHECK(m.nvlink.bandwidth_Bps == Approx(400e9));
  CHECK(m.nvlink.latency_s == Approx(3e-6));
  CHECK(m.node.latency_s == Approx(5e-6));
  CHECK(m.network.bandwidth_Bps == Approx(50e9));
  CHECK(m.step_overhead_s == Approx(250e-6));
  CHECK(m.efficiency == 1.0);       // optional, default 1
  CHECK(m.network_rails == 1.0);    // optional, default 1: one rank's share
  CHECK(m.ring_overlap == 1.0);     // optional, default 1: the whole step hides
  CHECK(m.wait_core_share == 0.0);  // optional, default 0
  CHECK(parse_machine_text(
            replaced(kGood, "peak_tflops = 989", "peak_tflops = 989\nefficiency = 0.4"), "box.toml")
            .efficiency == Approx(0.4));
  CHECK(m.oversubscription(2) == 1.0);
  CHECK(m.oversubscription(8) == 4.0);
  MachineProfile slicing = m;
  slicing.time_slice_efficiency = 0.8;
  CHECK(slicing.oversubscription(8) == Approx(8 / (2 * 0.8)));
  CHECK(slicing.oversubscription(2) == 1.0);
  CHECK(m.link(LinkClass::network).latency_s == Approx(10e-6));
  CHECK(m.network.seconds(50e9, 2) == Approx(1 + 20e-6));
}

TEST_CASE("a written profile reads back equal") {
  MachineProfile m = parse_machine_text(kGood, "box.toml");
  m.layer_overhead_s = 25e-6;
  m.optimizer_s_per_param = 3e-9;
  m.wait_core_share = 0.07;
  m.time_slice_efficiency = 0.96;
  m.network_rails = 8;
  m.ring_overlap = 0.75;
  m.collective_round_s = 7e-6;
  m.ring_step_s = 41e-6;
  m.alltoall_s = 13e-6;
  m.node.collective_Bps = 37e9;
  const MachineProfile r = parse_machine_text(machine_to_toml(m), "again.toml");
  CHECK(r.node.collective_Bps == Approx(37e9));
  CHECK(r.node.reduction_Bps() == Approx(37e9));
  CHECK(r.network.collective_Bps == 0);  // optional, default 0: the link's bandwidth
  CHECK(r.network.reduction_Bps() == Approx(m.network.bandwidth_Bps));
  CHECK(r.collective_round_s == Approx(7e-6));
  CHECK(r.ring_step_s == Approx(41e-6));
  CHECK(r.alltoall_s == Approx(13e-6));
  CHECK(r.network_rails == 8);
  CHECK(r.ring_overlap == Approx(0.75));
  CHECK(r.layer_overhead_s == Approx(m.layer_overhead_s));
  CHECK(r.optimizer_s_per_param == Approx(m.optimizer_s_per_param));
  CHECK(r.wait_core_share == Approx(0.07));
  CHECK(r.time_slice_efficiency == Approx(0.96));
  CHECK(r.name == m.name);
  CHECK(r.cores_per_node == m.cores_per_node);
  CHECK(r.gemm_flops == Approx(m.gemm_flops));
  CHECK(r.attention_flops == Approx(m.attention_flops));
  CHECK(r.memory_Bps == Approx(m.memory_Bps));
  CHECK(r.node.bandwidth_Bps == Approx(m.node.bandwidth_Bps));
  CHECK(r.network.latency_s == Approx(m.network.latency_s));
  CHECK(r.step_overhead_s == Approx(m.step_overhead_s));
  CHECK(r.efficiency == Approx(m.efficiency));
}

TEST_CASE("the shipped reference profiles read") {
  const char* src = std::getenv("TRIDENT_SOURCE_DIR");
  REQUIRE(src);
  for (const char* f : {"h100-sxm.toml", "h200-sxm.toml"}) {
    const MachineProfile m = load_machine(std::string(src) + "/share/trident/machines/" + f);
    CHECK(m.gemm_flops < m.peak_flops);
    CHECK(m.nvlink.bandwidth_Bps > m.network.bandwidth_Bps);
  }
}

TEST_CASE("bad machine files are refused with one line naming file, line and key") {
  CHECK(refusal(replaced(kGood, "gemm_tflops = 500\n", "")) ==
        "box.toml: compute.gemm_tflops: missing (every profile sets it; see planner.md)");
  CHECK(refusal(replaced(kGood, "gemm_tflops = 500", "gemm_tflops = -5")) ==
        "box.toml:7: compute.gemm_tflops: must be a number > 0");
  CHECK(refusal(replaced(kGood, "gemm_tflops = 500", "gemm_tflops = \"fast\"")) ==
        "box.toml:7: compute.gemm_tflops: must be a number > 0");
  CHECK(refusal(replaced(kGood, "latency_us = 3", "latency_us = -1")) ==
        "box.toml:13: link.nvlink.latency_us: must be a number >= 0");
  CHECK(refusal(replaced(kGood, "latency_us = 3", "latency_us = 3\nlatencyus = 4")) ==
        "box.toml:14: link.nvlink.latencyus: unknown key");
  CHECK(refusal(replaced(kGood, "peak_tflops = 989", "efficiency = 0")) ==
        "box.toml:10: compute.efficiency: must be a number > 0");
  CHECK(refusal(replaced(kGood, "cores_per_node = 2", "cores_per_node = 1.5")) ==
        "box.toml:5: machine.cores_per_node: must be an integer >= 0");
  CHECK(refusal(replaced(kGood, "peak_tflops = 989", "ring_overlap = 1.2")) ==
        "box.toml:10: compute.ring_overlap: must be a number from 0 to 1");
  CHECK(
      refusal(replaced(kGood, "cores_per_node = 2", "cores_per_node = 2\nwait_core_share = 1.5")) ==
      "box.toml:6: machine.wait_core_share: must be a number from 0 to 1");
  CHECK(refusal(replaced(kGood, "cores_per_node = 2",
                         "cores_per_node = 2\ntime_slice_efficiency = 0")) ==
        "box.toml:6: machine.time_slice_efficiency: must be a number > 0 and <= 1");
  CHECK(refusal(replaced(kGood, "name = \"test box\"\n", "")) == "box.toml: machine.name: missing");
  const std::string syntax = refusal(replaced(kGood, "[compute]", "[compute"));
  INFO(syntax);
  CHECK(syntax.rfind("box.toml:6: TOML syntax error", 0) == 0);
  CHECK(syntax.find('\n') == std::string::npos);
  CHECK_THROWS_WITH(load_machine("/nonexistent/m.toml"),
                    "/nonexistent/m.toml: cannot read the machine profile");
}
