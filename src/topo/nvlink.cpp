// NVLink islands from NVML's per-device link reports (see topo/nvlink.hpp).
#include "trident/topo/nvlink.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <numeric>

namespace trident {

std::string canonical_bus_id(const std::string& id) {
  std::string s;
  for (char c : id)
    if (!std::isspace(static_cast<unsigned char>(c)))
      s += char(std::tolower(static_cast<unsigned char>(c)));
  // domain:bus:device.function, or bus:device.function without the domain
  const size_t colons = size_t(std::count(s.begin(), s.end(), ':'));
  if (colons == 1) return "0000:" + s;
  if (colons != 2) return s;
  std::string domain = s.substr(0, s.find(':'));
  const std::string rest = s.substr(s.find(':'));
  while (domain.size() > 4 && domain[0] == '0') domain.erase(0, 1);
  while (domain.size() < 4) domain.insert(0, "0");
  return domain + rest;
}

std::string fabric_label(const unsigned char (&cluster_uuid)[16], unsigned clique_id) {
  bool any = false;
  for (unsigned char b : cluster_uuid) any = any || b != 0;
  if (!any) return "";
  char hex[33] = {0};
  for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", cluster_uuid[i]);
  return std::string(hex) + ":" + std::to_string(clique_id);
}

namespace {

int find_root(std::vector<int>& parent, int i) {
  while (parent[size_t(i)] != i) {
    parent[size_t(i)] = parent[size_t(parent[size_t(i)])];
    i = parent[size_t(i)];
  }
  return i;
}

void join(std::vector<int>& parent, int a, int b) {
  a = find_root(parent, a);
  b = find_root(parent, b);
  if (a == b) return;
  parent[size_t(std::max(a, b))] = std::min(a, b);  // the smaller index names the island
}

}  // namespace

std::vector<int> nvlink_islands(const std::vector<NvlinkDevice>& devices) {
  const int n = int(devices.size());
  std::vector<int> parent(static_cast<size_t>(n));
  std::iota(parent.begin(), parent.end(), 0);
  std::map<std::string, int> index;
  for (int i = 0; i < n; ++i) index[canonical_bus_id(devices[size_t(i)].bus_id)] = i;
  int first_switched = -1;
  for (int i = 0; i < n; ++i) {
    const NvlinkDevice& d = devices[size_t(i)];
    for (const std::string& peer : d.gpu_peers) {
      const auto it = index.find(canonical_bus_id(peer));
      if (it != index.end()) join(parent, i, it->second);  // a GPU of another node: not ours
    }
    if (d.switch_links > 0) {
      if (first_switched < 0) first_switched = i;
      join(parent, first_switched, i);
    }
  }
  std::vector<int> island(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) island[size_t(i)] = find_root(parent, i);
  return island;
}

int nvlink_island_size(const std::vector<NvlinkDevice>& devices, int i) {
  const std::vector<int> island = nvlink_islands(devices);
  if (i < 0 || i >= int(island.size())) return 0;
  return int(std::count(island.begin(), island.end(), island[size_t(i)]));
}

}  // namespace trident
