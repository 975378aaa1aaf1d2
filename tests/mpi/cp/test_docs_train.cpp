// Training on packed documents with parallel.cp_layout = "docs" equals the
// one-rank run: per-step losses and gradient norms over 4 steps within 1e-4,
// cp = 2 (x dp 2) and cp = 4, with and without a sliding window, with and
// without reset positions, MoE layers included (their capacity is decided by
// each token's place in its sequence, which the layout permutes). The data
// is a flat token file with end-of-document tokens and long-tailed document
// lengths, written by the test; the test also checks that the layout it
// trains with is not zig-zag's for some sample (or the parity says nothing
// about the new layout).
#include <mpi.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "mpi_test_util.hpp"
#include "tiny_config.hpp"
#include "train_steps.hpp"
#include "trident/core/rng.hpp"
#include "trident/model/transformer.hpp"
#include "trident/topo/topology.hpp"
#include "trident/train/check_config.hpp"
#include "trident/train/trainer.hpp"

using namespace trident;
using trident::testing::Curve;

namespace {

constexpr int kVocab = 32, kEod = 0;

// Documents of long-tailed lengths (1 to about 60 tokens) ending in kEod.
std::string write_tokens() {
  int pid = int(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);  // one name on every rank
  const std::string path = "trident-docs-train-" + std::to_string(pid) + ".bin";
  if (testing::world_rank() == 0) {
    std::vector<float> z(4096);
    rng::fill_normal(z.data(), int64_t(z.size()), rng::hash_name("docs train"), 0, 1.0f);
    std::vector<uint16_t> ids;
    for (size_t d = 0; ids.size() < 3000; ++d) {
      const int len = 1 + int(std::exp(2.0 + 1.0 * z[d % z.size()]));
      for (int i = 0; i + 1 < len; ++i)
        ids.push_back(uint16_t(1 + (ids.size() * 7 + d * 3) % (kVocab - 1)));
      ids.push_back(uint16_t(kEod));
    }
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return path;
}

Config tiny(const std::string& file) {
  Config c = testing::tiny_config(
      {.vocab = kVocab, .moe_every = 2},
      {.task = DataTask::tokens, .seq_len = 64, .micro_batch = 2, .microbatches = 2},
      {.steps = 4, .lr = 1e-2, .warmup = 1, .grad_clip = 0.5});
  c.model.capacity_factor = 1.0;  // tokens dropped by their place in the sequence
  c.data.token_file = file;
  c.data.eod_token = kEod;
  c.data.packing = Packing::documents;
  c.parallel.cp_layout = CpLayout::docs;
  return testing::test_run_settings(c);
}

// Some sample of the first steps is laid out unlike zig-zag on this rank.
bool differs_from_zigzag(const Config& cfg, int cp, int rank, int dp) {
  auto data = model::make_data_source(cfg, dp);
  const auto zz = cp::local_positions(cfg.data.seq_len, cp, rank, CpLayout::zigzag);
  for (int64_t step = 0; step < cfg.train.steps; ++step)
    for (const auto& mb : model::make_microbatches(
             *data, cfg.data, step, 0, zz, model::DocumentBalance{cp, rank, cfg.model.window}))
      for (size_t t = 0; t < mb.seq_positions.size(); ++t)
        if (mb.seq_positions[t] != zz[t % zz.size()]) return true;
  return false;
}

void check_case(Config cfg, int cp, int64_t window, bool reset) {
  const int world = testing::world_size();
  cfg.parallel.cp = cp;
  cfg.model.window = window;
  cfg.data.reset_positions = reset;
  const int dp = world / cp;
  train::check_config(cfg, world);
  Topology t = detect_topology(testing::world_comm(), cfg);
  auto c = build_communicators(testing::world_comm(), cfg, std::move(t));
  REQUIRE(differs_from_zigzag(cfg, cp, c->cp->rank(), dp));
  train::Trainer par_t(cfg, testing::train_comms(*c));
  const Curve par = testing::train_steps(par_t, cfg.train.steps);
  if (testing::world_rank() != 0) return;
  Config one = cfg;
  one.parallel.cp = 1;
  one.data.num_microbatches *= dp;
  train::Trainer ser_t(one, {});
  const Curve ser = testing::train_steps(ser_t, cfg.train.steps);
  for (size_t s = 0; s < ser.loss.size(); ++s) {
    std::printf(
        "docs cp=%d dp=%d window=%lld reset=%d: step %zu loss %.7f (serial %.7f) norm %.6f "
        "(serial %.6f)\n",
        cp, dp, static_cast<long long>(window), int(reset), s, par.loss[s], ser.loss[s],
        par.norm[s], ser.norm[s]);
    INFO("cp=" << cp << " window " << window << " reset " << reset << " step " << s);
    REQUIRE(std::fabs(par.loss[s] - ser.loss[s]) <= 1e-4 * std::fabs(ser.loss[s]));
    REQUIRE(std::fabs(par.norm[s] - ser.norm[s]) <= 1e-4 * std::fabs(ser.norm[s]));
  }
  REQUIRE(ser.loss.back() < ser.loss.front());  // the run trained
}

}  // namespace

TEST_CASE("cp_layout docs: packed training on cp 2 and 4 equals one rank", "[parity][np4]") {
  REQUIRE(testing::world_size() == 4);
  const std::string file = write_tokens();
  check_case(tiny(file), 4, 0, true);
  check_case(tiny(file), 4, 5, false);  // window below a chunk (64 / 8), global RoPE positions
  check_case(tiny(file), 2, 20, true);  // cp 2 x dp 2, window over a chunk
  MPI_Barrier(MPI_COMM_WORLD);
  if (testing::world_rank() == 0) std::remove(file.c_str());
}
