// Ulysses and hybrid (Ulysses x ring) context parallelism (src/parallel/cp)
// against the one-rank computation: every rank regenerates the whole
// sequence, computes full attention on its own, and compares its shard of
// out, lse, dq, dk, dv with what the all-to-all (and the ring) gave. CP
// groups of 2, 4 and 8 ranks with Ulysses groups of 2 and 4 (u = cp: pure
// Ulysses; u < cp: hybrid), both layouts of the ring dimension, MHA and GQA
// (K/V heads split, and replicated when u > n_kv_heads).
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "random.hpp"
#include "trident/comm/comm.hpp"
#include "trident/core/error.hpp"
#include "trident/parallel/cp/config_rules.hpp"
#include "trident/parallel/cp/ring_attention.hpp"
#include "trident/parallel/cp/ulysses_attention.hpp"

using namespace trident;
using trident::testing::random_tensor;
using trident::testing::split_cp;
using trident::testing::world_rank;
using trident::testing::world_size;

namespace {

struct Case {
  int64_t seq;
  int H, Hkv, D;
  bool causal;
  cp::Layout layout;
};

std::string describe(const Case& c, int cp, int u) {
  return "cp=" + std::to_string(cp) + " u=" + std::to_string(u) + " seq=" + std::to_string(c.seq) +
         " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) +
         " D=" + std::to_string(c.D) + (c.causal ? " causal " : " full ") +
         cp::layout_name(c.layout);
}

void check_case(Communicator& comm, int u, const Case& c) {
  const int cp = comm.size(), rank = comm.rank();
  const std::string key = describe(c, cp, u);
  INFO(key);
  const int64_t qrow = int64_t(c.H) * c.D, kvrow = int64_t(c.Hkv) * c.D;
  const Tensor q = random_tensor({c.seq, qrow}, key + "q"),
               k = random_tensor({c.seq, kvrow}, key + "k");
  const Tensor v = random_tensor({c.seq, kvrow}, key + "v");
  const Tensor dout = random_tensor({c.seq, qrow}, key + "do");

  cp::RingAttention serial(nullptr, c.layout, c.causal, c.seq);
  const Tensor out({c.seq, qrow}), lse({c.seq, c.H}), dq({c.seq, qrow}), dk({c.seq, kvrow}),
      dv({c.seq, kvrow});
  serial.forward(q, k, v, c.H, c.Hkv, c.D, out, lse);
  serial.backward(q, k, v, out, lse, dout, c.H, c.Hkv, c.D, dq, dk, dv);

  cp::UlyssesAttention ulysses(&comm, u, c.layout, c.causal, c.seq, c.H, c.Hkv, c.D);
  prof::Recorder work;
  ulysses.set_profiler(&work);
  const int64_t T = ulysses.local_tokens();
  REQUIRE(T == c.seq / cp);
  REQUIRE(ulysses.ring_size() == cp / u);
  REQUIRE(ulysses.positions() == cp::local_positions(c.seq, cp, rank, c.layout, u));
  auto shard = [&](const Tensor& g) {
    const Tensor l({T, g.numel() / c.seq});
    cp::scatter_to_local(g, l, cp, rank, c.layout, u);
    return l;
  };
  const Tensor lq = shard(q), lk = shard(k), lv = shard(v), ldo = shard(dout);
  // Outputs start as garbage: the exchange must overwrite, not accumulate.
  const Tensor lout = random_tensor({T, qrow}, "garbage"),
               llse = random_tensor({T, c.H}, "garbage");
  const Tensor ldq = random_tensor({T, qrow}, "garbage");
  const Tensor ldk = random_tensor({T, kvrow}, "garbage"),
               ldv = random_tensor({T, kvrow}, "garbage");
  ulysses.forward(lq, lk, lv, lout, llse);
  const double fwd_bytes = work.counter("ulysses.bytes_sent");
  ulysses.backward(lq, lk, lv, lout, llse, ldo, ldq, ldk, ldv);

  CHECK(rel_l2_diff(lout, shard(out)) <= 1e-5);
  CHECK(rel_l2_diff(llse, shard(lse)) <= 1e-5);
  CHECK(rel_l2_diff(ldq, shard(dq)) <= 1e-5);
  CHECK(rel_l2_diff(ldk, shard(dk)) <= 1e-5);
  CHECK(rel_l2_diff(ldv, shard(dv)) <= 1e-5);

  // Bytes: forward sends q, k, v out and out, lse back; the backward sends
  // q, k, v, out, lse, dout out and dq, dk, dv back; each to u-1 peers.
  const double hq = c.H / u, hkv = c.Hkv % u == 0 ? c.Hkv / u : 1;
  const double qb = T * hq * c.D * 4.0, kvb = T * hkv * c.D * 4.0, lb = T * hq * 4.0;
  CHECK(fwd_bytes == (u - 1) * (qb + 2 * kvb + qb + lb));
  CHECK(work.counter("ulysses.bytes_sent") - fwd_bytes ==
        (u - 1) * (3 * qb + 2 * kvb + lb + qb + 2 * kvb));
  // The ring ran on the heads of this rank over cp/u groups.
  CHECK(work.counter("ring.calls") == 2);
  if (cp / u == 1) CHECK(work.counter("ring.bytes_sent") == 0);
  if (cp / u > 1) CHECK(work.counter("ring.bytes_sent") > 0);
}

}  // namespace

TEST_CASE("Ulysses layout: each rank holds one slice of its ring group's tokens", "[cp]") {
  using cp::Layout;
  // cp=4, u=2: ring groups {0,1} and {2,3}; zig-zag over 2 groups gives group
  // 0 chunks 0 and 3 of 4, group 1 chunks 1 and 2.
  CHECK(cp::local_positions(16, 4, 0, Layout::zigzag, 2) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(cp::local_positions(16, 4, 1, Layout::zigzag, 2) == std::vector<int64_t>{12, 13, 14, 15});
  CHECK(cp::local_positions(16, 4, 2, Layout::zigzag, 2) == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(cp::local_positions(16, 4, 3, Layout::contiguous, 2) ==
        std::vector<int64_t>{12, 13, 14, 15});
  // A slice across both zig-zag chunks: cp=u=3 over 12 tokens, rank 1.
  CHECK(cp::local_positions(12, 3, 1, Layout::zigzag, 3) == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(cp::local_runs(12, 3, 1, Layout::zigzag, 3).size() == 2);
  // ulysses = 1 is the ring's layout.
  for (int r = 0; r < 4; ++r)
    CHECK(cp::local_positions(48, 4, r, Layout::zigzag, 1) ==
          cp::local_positions(48, 4, r, Layout::zigzag));
  for (Layout l : {Layout::contiguous, Layout::zigzag}) {
    for (int u : {2, 4, 8}) {
      const int64_t seq = 96, row = 3;
      const Tensor g = random_tensor({seq, row}, "layout"), back({seq, row});
      std::vector<int> seen(seq, 0);
      for (int r = 0; r < 8; ++r) {
        for (int64_t p : cp::local_positions(seq, 8, r, l, u)) seen[size_t(p)] += 1;
        const Tensor local({seq / 8, row});
        cp::scatter_to_local(g, local, 8, r, l, u);
        cp::gather_to_global(local, back, 8, r, l, u);
      }
      CHECK(std::ranges::equal(back.values(), g.values()));
      for (int s : seen) CHECK(s == 1);
    }
  }
}

TEST_CASE("cp_mode rules: group sizes and heads", "[cp]") {
  CHECK(cp::ulysses_size(CpMode::ring, 8, 0) == 1);
  CHECK(cp::ulysses_size(CpMode::ulysses, 8, 0) == 8);
  CHECK(cp::ulysses_size(CpMode::hybrid, 8, 2) == 2);
  CHECK(cp::mode_rule_broken(CpMode::ring, 8, 0).empty());
  CHECK(cp::mode_rule_broken(CpMode::ring, 8, 2).find("parallel.cp_ulysses=2") == 0);
  CHECK(cp::mode_rule_broken(CpMode::ulysses, 8, 8).empty());
  CHECK(!cp::mode_rule_broken(CpMode::ulysses, 8, 4).empty());
  CHECK(cp::mode_rule_broken(CpMode::hybrid, 8, 4).empty());
  for (int bad : {0, 1, 3, 8, 16}) CHECK(!cp::mode_rule_broken(CpMode::hybrid, 8, bad).empty());
  CHECK(cp::heads_rule_broken(8, 2, 4).empty());  // one K/V head per rank, replicated twice
  CHECK(cp::heads_rule_broken(8, 8, 4).empty());  // two K/V heads per rank
  CHECK(cp::heads_rule_broken(6, 6, 4).find("model.n_heads=6") == 0);
  CHECK(cp::heads_rule_broken(12, 6, 4).find("model.n_kv_heads=6") == 0);
}

TEST_CASE("Ulysses and hybrid attention equal one-rank attention (forward and gradients)", "[cp]") {
  for (int cp : {2, 4, 8}) {
    if (world_size() % cp != 0) continue;
    auto comm = split_cp(cp);
    for (int u : {2, 4}) {
      if (cp % u != 0) continue;
      for (cp::Layout layout : {cp::Layout::contiguous, cp::Layout::zigzag}) {
        // MHA; the causal diagonal cuts inside a kernel tile.
        check_case(*comm, u, Case{2 * cp * 20, 4, 4, 16, true, layout});
        // GQA with n_kv_heads % u == 0 (u = 2) or K/V heads replicated (u = 4).
        check_case(*comm, u, Case{2 * cp * 12, 8, 2, 12, true, layout});
        // One K/V head on every rank; no mask.
        check_case(*comm, u, Case{2 * cp * 12, 4, 1, 8, false, layout});
      }
    }
  }
}

TEST_CASE("Ulysses refuses heads that do not split over its group", "[cp][multirank]") {
  REQUIRE(world_size() % 2 == 0);
  auto comm = split_cp(2);
  CHECK_THROWS_AS(cp::UlyssesAttention(comm.get(), 2, cp::Layout::zigzag, true, 16, 3, 3, 8),
                  InputError);
}
