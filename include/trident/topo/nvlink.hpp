// NVLink islands of one node, from what NVML reports per device: the PCI bus
// id of every GPU, the GPUs at the far end of its active NVLinks, and how
// many of its links end in an NVSwitch. The pure part (bus-id spelling,
// fabric labels, islands) is here and unit-tested; the NVML probe that fills
// NvlinkDevice lives in topology_devices.cpp (dlopen, no nvml.h).
#pragma once
#include <string>
#include <vector>

namespace trident {

struct NvlinkDevice {
  std::string bus_id;                  // canonical_bus_id of this GPU
  std::vector<std::string> gpu_peers;  // canonical bus ids at the far end of GPU-to-GPU links
  int switch_links = 0;                // active links that end in an NVSwitch
};

// One spelling for PCI bus ids: NVML writes an 8-digit domain
// ("00000000:1A:00.0"), CUDA a 4-digit one ("0000:1a:00.0"); the result is
// lower case with a 4-digit domain. An id without a domain gets 0000.
std::string canonical_bus_id(const std::string& id);

// "<cluster uuid hex>:<clique id>" of a multi-node NVLink fabric (NVL72 and
// the like); "" when the uuid is all zero (no fabric).
std::string fabric_label(const unsigned char (&cluster_uuid)[16], unsigned clique_id);

// For each device, the island (connected set over NVLink) it belongs to, as
// the smallest device index in it. GPUs linked directly are joined, and all
// GPUs with NVSwitch links are joined (a node's switches connect every GPU
// attached to them). A device without active links is an island of its own.
std::vector<int> nvlink_islands(const std::vector<NvlinkDevice>& devices);

// Number of devices in the island of device i.
int nvlink_island_size(const std::vector<NvlinkDevice>& devices, int i);

}  // namespace trident
