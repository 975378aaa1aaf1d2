// Activation capture from a cp=4 zig-zag ring (issue part 3): each rank
// writes its shard of q, k, v and attn_out through RunFile::write_activation
// with the global positions of the layout; rank 0 then reads the file back
// with plain HDF5 and checks that q, k, v are the global tensors in global
// order and that attention recomputed from them in fp64 gives attn_out, i.e.
// an analyst can reproduce the attention from the file alone.
#include <hdf5.h>
#include <mpi.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "random.hpp"
#include "trident/core/config.hpp"
#include "trident/io/run_file.hpp"
#include "trident/parallel/cp/ring_attention.hpp"
#include "trident/topo/topology.hpp"

using namespace trident;
using trident::testing::random_tensor;
using trident::testing::world_rank;
using trident::testing::world_size;

namespace {

constexpr int kCp = 4;

// The sizes of the capture: two samples, GQA, seq split into 2*cp chunks of
// 20 tokens (so a rank's two runs are not multiples of the kernel tiles).
constexpr int64_t kSeq = 160;
constexpr int kHeads = 4, kKvHeads = 2, kHeadDim = 16;
const std::vector<int> kSampleIds = {0, 3};

Config capture_config() {
  Config cfg;
  cfg.model.n_heads = kHeads;
  cfg.model.n_kv_heads = kKvHeads;
  cfg.model.d_model = kHeads * kHeadDim;
  cfg.data.seq_len = static_cast<int>(kSeq);
  cfg.parallel.cp = kCp;
  cfg.parallel.cp_layout = CpLayout::zigzag;
  cfg.runtime.timeout_s = 30;
  cfg.topology = TopologyOverride{1, world_size(), world_size()};
  cfg.source = "<activation capture test>";
  return cfg;
}

// A directory made by rank 0, removed at the end; every rank knows its name.
struct SharedTempDir {
  std::string path;
  SharedTempDir() {
    char buf[256] = {0};
    if (world_rank() == 0) {
      const std::string tmpl =
          (std::filesystem::temp_directory_path() / "trident-cp-capture-XXXXXX").string();
      std::snprintf(buf, sizeof buf, "%s", tmpl.c_str());
      if (!mkdtemp(buf)) buf[0] = 0;
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path = buf;
  }
  ~SharedTempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ec;
    if (world_rank() == 0 && !path.empty()) std::filesystem::remove_all(path, ec);
  }
};

// The dataset's dimensions and its data as float (empty when missing).
struct Dataset {
  std::vector<hsize_t> dims;
  std::vector<float> data;
};

Dataset read_dataset(hid_t file, const std::string& path) {
  Dataset out;
  const hid_t d = H5Dopen2(file, path.c_str(), H5P_DEFAULT);
  if (d < 0) return out;
  const hid_t space = H5Dget_space(d);
  out.dims.resize(static_cast<size_t>(H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, out.dims.data(), nullptr);
  out.data.resize(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data.data()) < 0)
    out.data.clear();
  H5Sclose(space);
  H5Dclose(d);
  return out;
}

// softmax(q k^T / sqrt(D), causal) v for one sample, straight from the
// definition in fp64: q [seq, H, D], k/v [seq, Hkv, D] -> [seq, H, D].
std::vector<double> naive_causal_attention(const float* q, const float* k, const float* v) {
  std::vector<double> out(static_cast<size_t>(kSeq * kHeads * kHeadDim), 0.0);
  const double scale = 1.0 / std::sqrt(double(kHeadDim));
  std::vector<double> score(static_cast<size_t>(kSeq));
  for (int64_t i = 0; i < kSeq; ++i) {
    for (int h = 0; h < kHeads; ++h) {
      const int g = h / (kHeads / kKvHeads);
      const float* qi = q + (i * kHeads + h) * kHeadDim;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= i; ++j) {
        const float* kj = k + (j * kKvHeads + g) * kHeadDim;
        double s = 0;
        for (int d = 0; d < kHeadDim; ++d) s += double(qi[d]) * double(kj[d]);
        score[size_t(j)] = s * scale;
        mx = std::max(mx, score[size_t(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(score[size_t(j)] - mx);
      double* oi = out.data() + (i * kHeads + h) * kHeadDim;
      for (int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(score[size_t(j)] - mx) / sum;
        const float* vj = v + (j * kKvHeads + g) * kHeadDim;
        for (int d = 0; d < kHeadDim; ++d) oi[d] += p * double(vj[d]);
      }
    }
  }
  return out;
}

// Sample s of t [S, rows, ...] as [rows, ...].
Tensor sample(const Tensor& t, int64_t s) {
  std::vector<int64_t> shape(t.shape().begin() + 1, t.shape().end());
  return t.rows(s, s + 1).reshape(shape);
}

// This rank's shards [S, T, heads, D] of q, k, v [S, seq, heads, D] and the
// ring's output, sample by sample through the ring.
struct Shards {
  Tensor q, k, v, out;
};

Shards ring_shards(cp::RingAttention& ring, int rank, const Tensor& q, const Tensor& k,
                   const Tensor& v) {
  const int64_t S = q.dim(0), T = ring.local_tokens();
  Shards l{Tensor({S, T, kHeads, kHeadDim}), Tensor({S, T, kKvHeads, kHeadDim}),
           Tensor({S, T, kKvHeads, kHeadDim}), Tensor({S, T, kHeads, kHeadDim})};
  const Tensor lse({T, kHeads});
  for (int64_t s = 0; s < S; ++s) {
    const Tensor sq = sample(l.q, s), sk = sample(l.k, s), sv = sample(l.v, s);
    cp::scatter_to_local(sample(q, s), sq, kCp, rank, cp::Layout::zigzag);
    cp::scatter_to_local(sample(k, s), sk, kCp, rank, cp::Layout::zigzag);
    cp::scatter_to_local(sample(v, s), sv, kCp, rank, cp::Layout::zigzag);
    ring.forward(sq, sk, sv, kHeads, kKvHeads, kHeadDim, sample(l.out, s), lse);
  }
  return l;
}

}  // namespace

TEST_CASE("cp=4 zig-zag ring: q, k, v, attn_out captured in global order reproduce attention",
          "[cp][activations]") {
  REQUIRE(world_size() == kCp);  // one CP group, dp = 1: every position written once
  const int64_t S = static_cast<int64_t>(kSampleIds.size());
  const int64_t qrow = int64_t(kHeads) * kHeadDim, kvrow = int64_t(kKvHeads) * kHeadDim;

  const Config cfg = capture_config();
  auto comms = build_communicators(trident::testing::world_comm(), cfg,
                                   detect_topology(trident::testing::world_comm(), cfg));
  REQUIRE(comms->cp);
  REQUIRE(comms->cp->size() == kCp);

  // The global tensors [S, seq, heads, D], the same on every rank.
  const Tensor q = random_tensor({S, kSeq, kHeads, kHeadDim}, "capture q");
  const Tensor k = random_tensor({S, kSeq, kKvHeads, kHeadDim}, "capture k");
  const Tensor v = random_tensor({S, kSeq, kKvHeads, kHeadDim}, "capture v");

  cp::RingAttention ring(comms->cp.get(), cp::Layout::zigzag, /*causal=*/true, kSeq);
  const int64_t T = ring.local_tokens();
  REQUIRE(T == kSeq / kCp);
  REQUIRE(ring.positions() ==
          cp::local_positions(kSeq, kCp, comms->cp->rank(), cp::Layout::zigzag));

  // Local shards [S, T, heads, D], sample by sample through the ring.
  const Shards l = ring_shards(ring, comms->cp->rank(), q, k, v);

  SharedTempDir dir;
  REQUIRE(!dir.path.empty());
  const std::string path = dir.path + "/capture.h5";
  const int step = 7, layer = 0;
  {
    RunFile rf(path, trident::testing::world_comm(), cfg, *comms, "");
    const std::vector<int64_t> qshape = {S, kSeq, kHeads, kHeadDim};
    const std::vector<int64_t> kvshape = {S, kSeq, kKvHeads, kHeadDim};
    rf.write_activation(step, layer, "q", qshape, kSampleIds, l.q.ptr(), ring.positions());
    rf.write_activation(step, layer, "k", kvshape, kSampleIds, l.k.ptr(), ring.positions());
    rf.write_activation(step, layer, "v", kvshape, kSampleIds, l.v.ptr(), ring.positions());
    rf.write_activation(step, layer, "attn_out", qshape, kSampleIds, l.out.ptr(), ring.positions());
    rf.close();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() != 0) return;

  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const std::string group =
      "/activations/step_" + std::to_string(step) + "/layer_" + std::to_string(layer) + "/";
  const Dataset fq = read_dataset(f, group + "q"), fk = read_dataset(f, group + "k");
  const Dataset fv = read_dataset(f, group + "v"), fo = read_dataset(f, group + "attn_out");
  H5Fclose(f);

  using Dims = std::vector<hsize_t>;
  const Dims qdims = {hsize_t(S), hsize_t(kSeq), hsize_t(kHeads), hsize_t(kHeadDim)};
  const Dims kvdims = {hsize_t(S), hsize_t(kSeq), hsize_t(kKvHeads), hsize_t(kHeadDim)};
  CHECK(fq.dims == qdims);
  CHECK(fk.dims == kvdims);
  CHECK(fv.dims == kvdims);
  CHECK(fo.dims == qdims);
  REQUIRE(int64_t(fq.data.size()) == q.numel());
  REQUIRE(int64_t(fk.data.size()) == k.numel());
  REQUIRE(int64_t(fv.data.size()) == v.numel());
  REQUIRE(int64_t(fo.data.size()) == q.numel());

  // Global order: the file holds exactly the one-rank tensors (the copies
  // are bit-exact, so any misplaced row or a NaN gap shows as a mismatch).
  auto mismatches = [](const std::vector<float>& a, const Tensor& b) {
    int64_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += (a[i] == b[int64_t(i)]) ? 0 : 1;
    return n;
  };
  CHECK(mismatches(fq.data, q) == 0);
  CHECK(mismatches(fk.data, k) == 0);
  CHECK(mismatches(fv.data, v) == 0);

  // Attention recomputed from the file's q, k, v against the file's attn_out.
  for (int64_t s = 0; s < S; ++s) {
    INFO("sample index " << s);
    const auto ref =
        naive_causal_attention(fq.data.data() + s * kSeq * qrow, fk.data.data() + s * kSeq * kvrow,
                               fv.data.data() + s * kSeq * kvrow);
    const float* got = fo.data.data() + s * kSeq * qrow;
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = double(got[i]) - ref[i];  // NaN (an unwritten row) fails below
      diff2 += d * d;
      ref2 += ref[i] * ref[i];
    }
    const double rel = std::sqrt(diff2 / ref2);
    CHECK(ref2 > 0);
    CHECK(rel <= 1e-5);
  }
}
