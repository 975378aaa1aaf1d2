// NVLink islands and the spellings NVML and CUDA use for the same device:
// bus ids, fabric labels, islands of NVLink-connected GPUs (direct links,
// NVSwitch, links to another node's GPU, unlinked devices).
#include <catch2/catch.hpp>

#include "trident/topo/nvlink.hpp"

using trident::NvlinkDevice;

TEST_CASE("PCI bus ids: NVML's and CUDA's spelling agree") {
  using trident::canonical_bus_id;
  CHECK(canonical_bus_id("00000000:1A:00.0") == "0000:1a:00.0");
  CHECK(canonical_bus_id("0000:1a:00.0") == "0000:1a:00.0");
  CHECK(canonical_bus_id("00000001:C3:00.0") == "0001:c3:00.0");
  CHECK(canonical_bus_id("1A:00.0") == "0000:1a:00.0");
  CHECK(canonical_bus_id(" 0000:1A:00.0\n") == "0000:1a:00.0");
  CHECK(canonical_bus_id("") == "");
}

TEST_CASE("fabric label: cluster uuid and clique, empty without a fabric") {
  unsigned char zero[16] = {0};
  CHECK(trident::fabric_label(zero, 7) == "");
  unsigned char uuid[16] = {0};
  uuid[0] = 0xab;
  uuid[15] = 0x01;
  CHECK(trident::fabric_label(uuid, 3) == "ab000000000000000000000000000001:3");
}

namespace {

NvlinkDevice dev(const std::string& bus, std::vector<std::string> peers, int switch_links = 0) {
  return NvlinkDevice{bus, std::move(peers), switch_links};
}

}  // namespace

TEST_CASE("NVLink islands") {
  SECTION("NVSwitch node: every GPU in one island") {
    std::vector<NvlinkDevice> d;
    for (int i = 0; i < 8; ++i) d.push_back(dev("0000:0" + std::to_string(i) + ":00.0", {}, 18));
    CHECK(trident::nvlink_islands(d) == std::vector<int>(8, 0));
    CHECK(trident::nvlink_island_size(d, 5) == 8);
  }
  SECTION("two 4-GPU islands of direct links (NVML's 8-digit domains as peers)") {
    std::vector<NvlinkDevice> d;
    for (int i = 0; i < 8; ++i) {
      std::vector<std::string> peers;
      const int base = i < 4 ? 0 : 4;
      for (int j = base; j < base + 4; ++j)
        if (j != i) peers.push_back("00000000:0" + std::to_string(j) + ":00.0");
      d.push_back(dev("0000:0" + std::to_string(i) + ":00.0", peers));
    }
    CHECK(trident::nvlink_islands(d) == std::vector<int>{0, 0, 0, 0, 4, 4, 4, 4});
    CHECK(trident::nvlink_island_size(d, 6) == 4);
  }
  SECTION("a chain joins transitively; unlinked and off-node peers stand alone") {
    std::vector<NvlinkDevice> d = {dev("0000:01:00.0", {"0000:02:00.0"}),
                                   dev("0000:02:00.0", {"0000:03:00.0"}), dev("0000:03:00.0", {}),
                                   dev("0000:04:00.0", {"0000:99:00.0"}),  // a GPU not on this node
                                   dev("0000:05:00.0", {})};
    CHECK(trident::nvlink_islands(d) == std::vector<int>{0, 0, 0, 3, 4});
    CHECK(trident::nvlink_island_size(d, 2) == 3);
    CHECK(trident::nvlink_island_size(d, 4) == 1);
    CHECK(trident::nvlink_island_size(d, 9) == 0);
  }
}
