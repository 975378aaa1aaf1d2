// alltoallv_plan: random counts on random group sizes; the plan's transfers,
// applied to host buffers, give what an all-to-all-v gives (each rank's
// block from every source at the receive displacement).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <vector>

#include "trident/comm/p2p_plan.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"

using namespace trident;

namespace {

struct Layout {
  std::vector<int64_t> counts, displs;
};

// counts[src][dst] elements, packed in destination order with gaps of `gap`.
Layout send_layout(const std::vector<std::vector<int64_t>>& c, int src, int64_t gap) {
  Layout l;
  int64_t off = gap;
  for (size_t dst = 0; dst < c.size(); ++dst) {
    l.counts.push_back(c[size_t(src)][dst]);
    l.displs.push_back(off);
    off += c[size_t(src)][dst] + gap;
  }
  return l;
}

Layout recv_layout(const std::vector<std::vector<int64_t>>& c, int dst, int64_t gap) {
  Layout l;
  int64_t off = 0;
  for (size_t src = 0; src < c.size(); ++src) {
    l.counts.push_back(c[src][size_t(dst)]);
    l.displs.push_back(off);
    off += c[src][size_t(dst)] + gap;
  }
  return l;
}

}  // namespace

TEST_CASE("alltoallv_plan moves every block where an all-to-all-v puts it", "[comm]") {
  const size_t elem = 12;  // bytes per element: a row of 3 floats
  for (int P : {1, 2, 3, 5, 8}) {
    for (uint64_t trial = 0; trial < 4; ++trial) {
      const uint64_t key = rng::combine(uint64_t(P), trial);
      std::vector<std::vector<int64_t>> counts(static_cast<size_t>(P),
                                               std::vector<int64_t>(static_cast<size_t>(P)));
      for (int s = 0; s < P; ++s)
        for (int d = 0; d < P; ++d)  // 0..3 elements: some empty blocks on purpose
          counts[size_t(s)][size_t(d)] =
              std::max<int64_t>(0, int64_t(rng::uniform(key, uint64_t(s * P + d)) * 5.0f) - 1);
      std::vector<Layout> sl, rl;
      std::vector<std::vector<unsigned char>> send(static_cast<size_t>(P)),
          recv(static_cast<size_t>(P)), expect(static_cast<size_t>(P));
      for (int r = 0; r < P; ++r) {
        sl.push_back(send_layout(counts, r, 2));
        rl.push_back(recv_layout(counts, r, 1));
        const int64_t sn = sl.back().displs.back() + sl.back().counts.back() + 2;
        const int64_t rn = rl.back().displs.back() + rl.back().counts.back() + 1;
        send[size_t(r)].resize(size_t(sn) * elem);
        for (size_t i = 0; i < send[size_t(r)].size(); ++i)
          send[size_t(r)][i] = (unsigned char)(1 + (i * 7 + size_t(r) * 13) % 251);
        recv[size_t(r)].assign(size_t(rn) * elem, 0);
        expect[size_t(r)].assign(size_t(rn) * elem, 0);
      }
      // Reference: the all-to-all-v definition.
      for (int s = 0; s < P; ++s)
        for (int d = 0; d < P; ++d)
          std::memcpy(&expect[size_t(d)][size_t(rl[size_t(d)].displs[size_t(s)]) * elem],
                      &send[size_t(s)][size_t(sl[size_t(s)].displs[size_t(d)]) * elem],
                      size_t(counts[size_t(s)][size_t(d)]) * elem);
      // The plans, matched pairwise as grouped send/recv would match them.
      std::vector<AlltoallvPlan> plans;
      for (int r = 0; r < P; ++r)
        plans.push_back(alltoallv_plan(r, P, sl[size_t(r)].counts.data(),
                                       sl[size_t(r)].displs.data(), rl[size_t(r)].counts.data(),
                                       rl[size_t(r)].displs.data(), elem));
      for (int s = 0; s < P; ++s) {
        const AlltoallvPlan& ps = plans[size_t(s)];
        if (ps.self_copy)
          std::memcpy(&recv[size_t(s)][ps.self_recv_offset], &send[size_t(s)][ps.self_send_offset],
                      ps.self_bytes);
        for (const P2pTransfer& out : ps.sends) {
          REQUIRE(out.peer != s);
          REQUIRE(out.bytes > 0);
          const auto& pr = plans[size_t(out.peer)].recvs;
          auto in =
              std::find_if(pr.begin(), pr.end(), [&](const P2pTransfer& t) { return t.peer == s; });
          REQUIRE(in != pr.end());
          REQUIRE(in->bytes == out.bytes);
          std::memcpy(&recv[size_t(out.peer)][in->offset], &send[size_t(s)][out.offset], out.bytes);
        }
      }
      size_t recvs = 0, sends = 0;
      for (const auto& p : plans) recvs += p.recvs.size(), sends += p.sends.size();
      CHECK(recvs == sends);
      for (int r = 0; r < P; ++r) CHECK(recv[size_t(r)] == expect[size_t(r)]);
    }
  }
}

TEST_CASE("alltoallv_plan rejects negative counts and a self block of two sizes", "[comm]") {
  const int64_t sc[2] = {1, -1}, sd[2] = {0, 1}, rc[2] = {1, 1}, rd[2] = {0, 1};
  CHECK_THROWS_AS(alltoallv_plan(0, 2, sc, sd, rc, rd, 4), Error);
  const int64_t sc2[2] = {2, 1}, sd2[2] = {0, 2};
  CHECK_THROWS_AS(alltoallv_plan(0, 2, sc2, sd2, rc, rd, 4), Error);
}
