// Ring attention (src/parallel/cp) against the one-rank computation: every
// rank regenerates the whole sequence, computes full attention on its own,
// and compares its shard of out, lse, dq, dk, dv with what the ring gave.
// CP groups of 2, 4 and 8 ranks are split out of the world (as many as fit).
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "mpi_test_util.hpp"
#include "random.hpp"
#include "trident/comm/comm.hpp"
#include "trident/core/error.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/parallel/cp/ring_attention.hpp"

using namespace trident;
using trident::testing::random_tensor;
using trident::testing::split_cp;
using trident::testing::world_rank;
using trident::testing::world_size;

namespace {

// The L2 difference of a shard over the norm it would have at the whole
// tensor's root mean square: 1e-5 means as close as rel_l2_diff's 1e-5 on a
// shard of typical size.
double shard_rel_diff(const Tensor& got, const Tensor& want, const Tensor& whole) {
  const int64_t n = got.numel();
  double d = 0.0, w = 0.0;
  for (int64_t i = 0; i < n; ++i) d += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
  for (float x : whole.values()) w += double(x) * x;
  return std::sqrt(d / (w * double(n) / double(whole.numel())));
}

struct Case {
  int64_t seq;
  int H, Hkv, D;
  bool causal;
  cp::Layout layout;
};

std::string describe(const Case& c, int cp) {
  return "cp=" + std::to_string(cp) + " seq=" + std::to_string(c.seq) +
         " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) +
         " D=" + std::to_string(c.D) + (c.causal ? " causal " : " full ") +
         cp::layout_name(c.layout);
}

// Runs one case on a CP group and checks every output against one rank.
void check_ring_case(Communicator& comm, const Case& c) {
  const int cp = comm.size(), rank = comm.rank();
  INFO(describe(c, cp));
  const int64_t qrow = int64_t(c.H) * c.D, kvrow = int64_t(c.Hkv) * c.D;
  const std::string key = describe(c, cp);
  // Same global inputs on every rank (counter-based RNG keyed by the case).
  const Tensor q = random_tensor({c.seq, qrow}, key + "q"),
               k = random_tensor({c.seq, kvrow}, key + "k");
  const Tensor v = random_tensor({c.seq, kvrow}, key + "v");
  const Tensor dout = random_tensor({c.seq, qrow}, key + "do");

  // One rank: plain attention over the whole sequence.
  cp::RingAttention serial(nullptr, c.layout, c.causal, c.seq);
  const Tensor out({c.seq, qrow}), lse({c.seq, c.H}), dq({c.seq, qrow}), dk({c.seq, kvrow}),
      dv({c.seq, kvrow});
  serial.forward(q, k, v, c.H, c.Hkv, c.D, out, lse);
  serial.backward(q, k, v, out, lse, dout, c.H, c.Hkv, c.D, dq, dk, dv);

  // The ring, on this rank's shard.
  cp::RingAttention ring(&comm, c.layout, c.causal, c.seq);
  prof::Recorder work;
  ring.set_profiler(&work);
  const int64_t T = ring.local_tokens();
  REQUIRE(T == c.seq / cp);
  auto shard = [&](const Tensor& g) {
    const Tensor l({T, g.numel() / c.seq});
    cp::scatter_to_local(g, l, cp, rank, c.layout);
    return l;
  };
  const Tensor lq = shard(q), lk = shard(k), lv = shard(v), ldo = shard(dout);
  // Outputs start as garbage: the ring must overwrite, not accumulate.
  const Tensor lout = random_tensor({T, qrow}, "garbage"),
               llse = random_tensor({T, c.H}, "garbage");
  const Tensor ldq = random_tensor({T, qrow}, "garbage");
  const Tensor ldk = random_tensor({T, kvrow}, "garbage"),
               ldv = random_tensor({T, kvrow}, "garbage");
  const auto t0 = std::chrono::steady_clock::now();
  ring.forward(lq, lk, lv, c.H, c.Hkv, c.D, lout, llse);
  ring.backward(lq, lk, lv, lout, llse, ldo, c.H, c.Hkv, c.D, ldq, ldk, ldv);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  CHECK(rel_l2_diff(lout, shard(out)) <= 1e-5);
  CHECK(rel_l2_diff(llse, shard(lse)) <= 1e-5);
  // Gradients against the whole tensor's scale: a shard's own norm can be
  // rounding noise (the first query of a causal sequence sees one key, so
  // its dq is exactly 0 in exact arithmetic, and with one token per rank
  // that is rank 0's whole shard).
  CHECK(shard_rel_diff(ldq, shard(dq), dq) <= 1e-5);
  CHECK(shard_rel_diff(ldk, shard(dk), dk) <= 1e-5);
  CHECK(shard_rel_diff(ldv, shard(dv), dv) <= 1e-5);
  const int64_t nkv = T * kvrow;
  CHECK(work.counter("ring.calls") == 2);
  // K/V moved cp-1 times forward and cp-1 times backward, dK/dV cp times;
  // each is [T, Hkv, D] x 2 floats.
  CHECK(work.counter("ring.bytes_sent") == double((3 * cp - 2) * 2 * nkv * sizeof(float)));
  // The time counters split the calls' wall time without counting anything
  // twice: the MPI tests inside a compute span go to progress, not compute.
  const double compute_s = work.seconds("ring.forward") + work.seconds("ring.backward");
  const double progress_s = work.counter("ring.progress_s"), wait_s = work.seconds("ring.wait");
  CHECK(compute_s > 0);
  CHECK(progress_s >= 0);
  CHECK(wait_s >= 0);
  CHECK(compute_s + progress_s + wait_s <= wall);
}

std::vector<int> cp_sizes() {
  std::vector<int> sizes;
  for (int cp : {2, 4, 8})
    if (world_size() % cp == 0) sizes.push_back(cp);
  return sizes;
}

}  // namespace

TEST_CASE("layout positions: contiguous chunks and zig-zag pairs", "[cp]") {
  using cp::Layout;
  CHECK(cp::local_positions(8, 2, 0, Layout::zigzag) == std::vector<int64_t>{0, 1, 6, 7});
  CHECK(cp::local_positions(8, 2, 1, Layout::zigzag) == std::vector<int64_t>{2, 3, 4, 5});
  CHECK(cp::local_positions(8, 2, 1, Layout::contiguous) == std::vector<int64_t>{4, 5, 6, 7});
  CHECK(cp::local_positions(16, 4, 3, Layout::zigzag) == std::vector<int64_t>{6, 7, 8, 9});
  // Every position is held exactly once, and scatter/gather are inverse.
  for (Layout l : {Layout::contiguous, Layout::zigzag}) {
    const int64_t seq = 48, row = 3;
    const Tensor g = random_tensor({seq, row}, "layout"), back({seq, row});
    std::vector<int> seen(seq, 0);
    for (int r = 0; r < 4; ++r) {
      for (int64_t p : cp::local_positions(seq, 4, r, l)) seen[size_t(p)] += 1;
      const Tensor local({seq / 4, row});
      cp::scatter_to_local(g, local, 4, r, l);
      cp::gather_to_global(local, back, 4, r, l);
    }
    CHECK(std::ranges::equal(back.values(), g.values()));
    for (int s : seen) CHECK(s == 1);
    // A local tensor of other rows, or of another dtype, is refused.
    CHECK_THROWS_AS(cp::scatter_to_local(g, Tensor({seq / 4 + 1, row}), 4, 0, l), Error);
    CHECK_THROWS_AS(cp::gather_to_global(Tensor({seq / 4, row + 1}), back, 4, 0, l), Error);
    const Tensor ints = Tensor::empty({seq / 4, row}, cpu_allocator(), DType::i32);
    CHECK_THROWS_AS(cp::scatter_to_local(g, ints, 4, 0, l), Error);
  }
  CHECK(cp::parse_layout("zigzag") == Layout::zigzag);
  CHECK_THROWS_AS(cp::parse_layout("zig-zag"), InputError);
  CHECK_THROWS_AS(cp::check_layout(100, 4, Layout::zigzag), InputError);  // 100 % 8
  CHECK_NOTHROW(cp::check_layout(100, 4, Layout::contiguous));
  CHECK_THROWS_AS(cp::check_layout(100, 3, Layout::contiguous), InputError);
  CHECK_THROWS_AS(cp::RingAttention(nullptr, Layout::zigzag, true, 7), InputError);
}

TEST_CASE("ring attention equals one-rank attention (forward and gradients)", "[cp]") {
  for (int cp : cp_sizes()) {
    auto comm = split_cp(cp);
    for (cp::Layout layout : {cp::Layout::contiguous, cp::Layout::zigzag}) {
      for (bool causal : {true, false}) {
        // 40-token zig-zag chunks: the causal diagonal cuts inside a tile.
        check_ring_case(*comm, Case{2 * cp * 40, 4, 4, 16, causal, layout});
        // Grouped-query heads, odd head_dim.
        check_ring_case(*comm, Case{2 * cp * 24, 6, 2, 12, causal, layout});
      }
    }
  }
}

TEST_CASE("ring attention with chunks larger than a kernel tile", "[cp]") {
  REQUIRE(world_size() % 2 == 0);  // registered at 2, 4 and 8 ranks
  auto comm = split_cp(2);
  // 150-token zig-zag chunks (tiles of 128 queries and 256 keys: remainders).
  for (cp::Layout layout : {cp::Layout::contiguous, cp::Layout::zigzag})
    check_ring_case(*comm, Case{600, 2, 1, 32, true, layout});
}

TEST_CASE("ring attention with one-token chunks", "[cp][boundary]") {
  // seq = 2*cp (zig-zag) and seq = cp (contiguous): every chunk is one token,
  // so a key chunk that starts at a query chunk's last position is that
  // query's own token, and the ring must not skip it.
  for (int cp : cp_sizes()) {
    auto comm = split_cp(cp);
    for (bool causal : {true, false}) {
      check_ring_case(*comm, Case{2 * cp, 4, 2, 8, causal, cp::Layout::zigzag});
      check_ring_case(*comm, Case{int64_t(cp), 4, 2, 8, causal, cp::Layout::contiguous});
    }
  }
}

TEST_CASE("zig-zag balances causal work; contiguous does not", "[cp]") {
  for (int cp : cp_sizes()) {
    auto comm = split_cp(cp);
    const int64_t seq = 2 * cp * 16;
    const int H = 2, D = 8;
    const int64_t T = seq / cp;
    for (cp::Layout layout : {cp::Layout::contiguous, cp::Layout::zigzag}) {
      cp::RingAttention ring(comm.get(), layout, true, seq);
      prof::Recorder work;
      ring.set_profiler(&work);
      const Tensor q = random_tensor({T, H, D}, "bq"), k = random_tensor({T, H, D}, "bk");
      const Tensor out({T, H, D}), lse({T, H});
      ring.forward(q, k, k, H, H, D, out, lse);
      double most = work.counter("ring.flops"), least = most, total = most;
      comm->allreduce_max(&most, 1);
      comm->allreduce_min(&least, 1);
      comm->allreduce_sum(&total, 1);
      // All ranks together did exactly the causal attention of the sequence.
      kernels::AttnShape full{seq, seq, H, H, D, 1.0f, true, 0, 0};
      CHECK(total == kernels::attention_flops(full, false));
      if (layout == cp::Layout::zigzag) {
        CHECK(most == least);
      } else {
        // Last rank: cp-1 full blocks and a triangle; rank 0: the triangle.
        const double tri = double(T * (T + 1) / 2), blk = double(T * T);
        CHECK(most / least == Approx(((cp - 1) * blk + tri) / tri).epsilon(1e-12));
      }
    }
  }
}
