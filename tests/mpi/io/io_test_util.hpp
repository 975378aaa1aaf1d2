// Shared by the run-file tests and the writer program: a small config whose
// mesh is cp = world (one node), the communicators built from it, zig-zag
// positions, and readers that pull whole datasets back through HDF5.
#pragma once
#include <hdf5.h>
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "trident/core/config.hpp"
#include "trident/topo/topology.hpp"

namespace trident::testing {

// n_layers 4, MoE every 2nd layer (layers 1 and 3), 4 experts; cp = world.
inline Config io_test_config(int world) {
  Config cfg;
  cfg.model.n_layers = 4;
  cfg.model.n_experts = 4;
  cfg.model.moe_every = 2;
  cfg.model.top_k = 2;
  cfg.parallel.cp = world;
  cfg.parallel.pp = 1;
  cfg.parallel.ep = 1;
  cfg.runtime.timeout_s = 30;
  cfg.topology = TopologyOverride{1, world, world};
  cfg.source = "<io test>";
  return cfg;
}

inline std::unique_ptr<Communicators> io_test_comms(const Config& cfg) {
  return build_communicators(trident::testing::world_comm(), cfg,
                             detect_topology(trident::testing::world_comm(), cfg));
}

// Zig-zag layout over 2*cp chunks of `chunk` positions: rank r holds chunk r
// then chunk 2*cp-1-r (swap_halves lists them the other way round).
inline std::vector<int64_t> zigzag_positions(int r, int cp, int64_t chunk, bool swap_halves) {
  std::vector<int64_t> a, b;
  for (int64_t i = 0; i < chunk; ++i) {
    a.push_back(r * chunk + i);
    b.push_back((2 * cp - 1 - r) * chunk + i);
  }
  if (swap_halves) std::swap(a, b);
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A value that identifies its element exactly in float32:
// (s*1e4 + p*100 + h*10 + d) / 4 for an element [s, p, h, d] (all < 10 but p).
inline float tagged_value(int64_t s, int64_t p, int64_t h, int64_t d) {
  return static_cast<float>(s * 10000 + p * 100 + h * 10 + d) * 0.25f;
}

inline std::vector<hsize_t> dataset_dims(hid_t file, const std::string& path) {
  hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (d < 0) return {};
  hid_t s = H5Dget_space(d);
  int nd = H5Sget_simple_extent_ndims(s);
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5Sget_simple_extent_dims(s, dims.data(), nullptr);
  H5Sclose(s);
  H5Dclose(d);
  return dims;
}

// Reads the whole dataset converted to mem_type; T must match mem_type.
template <class T>
std::vector<T> read_all(hid_t file, const std::string& path, hid_t mem_type) {
  std::vector<T> out;
  hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (d < 0) return out;
  hid_t s = H5Dget_space(d);
  hssize_t n = H5Sget_simple_extent_npoints(s);
  out.resize(static_cast<size_t>(n));
  if (n > 0 && H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) out.clear();
  H5Sclose(s);
  H5Dclose(d);
  return out;
}

}  // namespace trident::testing
