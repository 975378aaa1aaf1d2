// Communicator tests: every collective and point-to-point path against the
// result computed locally from all ranks' (regenerable) inputs, the byte
// counters against what was handed over, and the deadline against a receive
// that nobody matches.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "mpi_test_util.hpp"
#include "trident/comm/comm.hpp"
#include "trident/comm/mpi/mpi_communicator.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"

using namespace trident;
using trident::testing::world_rank;
using trident::testing::world_size;

namespace {

// A fresh owned duplicate of world, so tests do not share message queues.
std::unique_ptr<Communicator> dup_world(CommKind kind, double timeout_s = 30.0) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  return std::make_unique<MpiCommunicator>(c, kind, "test-" + std::string(comm_kind_name(kind)),
                                           timeout_s, true);
}

// Input of rank r, element i: random, never zero, regenerable on any rank.
float input(int r, size_t i, uint64_t key) {
  return rng::uniform(rng::combine(key, uint64_t(r)), i) * 2.0f - 1.0f + 1e-3f;
}

}  // namespace

TEST_CASE("allreduce_sum on float equals the serial sum", "[comm]") {
  auto c = dup_world(CommKind::dp);
  const int p = c->size(), me = c->rank();
  for (size_t n : {size_t(1), size_t(7), size_t(1000), size_t(65537)}) {
    const uint64_t key = rng::hash_name("allreduce-float") + n;
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = input(me, i, key);
    c->allreduce_sum(x.data(), n);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      double ref = 0;
      double mag = 0;
      for (int r = 0; r < p; ++r) {
        ref += input(r, i, key);
        mag += std::fabs(input(r, i, key));
      }
      // Relative to the sum of magnitudes: the reduction order is MPI's.
      if (std::fabs(x[i] - ref) > 1e-5 * mag) ++bad;
    }
    CHECK(bad == 0);
  }
}

namespace {

// The sum of element i over ranks 0..p-1, bracketed in rank order, in float.
float rank_order_sum(int p, size_t i, uint64_t key) {
  float s = input(0, i, key);
  for (int r = 1; r < p; ++r) s = s + input(r, i, key);
  return s;
}

}  // namespace

TEST_CASE(
    "SumOrder::rank: all-reduce, reduce-scatter and reduces of pieces give the bits of "
    "the rank-order sum",
    "[comm]") {
  auto c = dup_world(CommKind::dp);
  const int p = c->size(), me = c->rank();
  // Sizes inside one chunk (128Ki floats; a reduce-scatter's chunks are
  // 128Ki / p floats of each block), across chunks, and beyond the window of
  // 4 chunks in flight.
  for (size_t block : {size_t(1), size_t(1000), size_t(65536 + 3), size_t(5 * 65536 + 7)}) {
    const size_t n = block * size_t(p);
    const uint64_t key = rng::hash_name("ordered-sum") + block;
    std::vector<float> mine(n);
    for (size_t i = 0; i < n; ++i) mine[i] = input(me, i, key);
    std::vector<float> ref(n);
    for (size_t i = 0; i < n; ++i) ref[i] = rank_order_sum(p, i, key);

    // Blocking all-reduce, in place.
    std::vector<float> x = mine;
    c->allreduce_sum(x.data(), n, SumOrder::rank);
    CHECK(std::memcmp(x.data(), ref.data(), n * sizeof(float)) == 0);

    // Reduce-scatter: this rank's block.
    std::vector<float> out(block, -7.0f);
    c->reduce_scatter_sum(mine.data(), out.data(), block, SumOrder::rank);
    CHECK(std::memcmp(out.data(), ref.data() + size_t(me) * block, block * sizeof(float)) == 0);

    // Non-blocking: two all-reduces of halves and one reduce per rank of
    // uneven pieces, all in flight together, waited for in reverse.
    std::vector<float> y = mine, z = mine;
    std::vector<Request> reqs;
    const size_t half = n / 2;
    reqs.push_back(c->iallreduce_sum(y.data(), half, SumOrder::rank));
    reqs.push_back(c->iallreduce_sum(y.data() + half, n - half, SumOrder::rank));
    std::vector<size_t> cut(size_t(p) + 1, 0);
    for (int r = 1; r <= p; ++r) cut[size_t(r)] = n * size_t(r) * size_t(r) / size_t(p * p);
    for (int r = 0; r < p; ++r)
      reqs.push_back(c->ireduce_sum(z.data() + cut[size_t(r)], cut[size_t(r) + 1] - cut[size_t(r)],
                                    r, SumOrder::rank));
    for (size_t k = reqs.size(); k-- > 0;) c->wait(reqs[k]);
    CHECK(std::memcmp(y.data(), ref.data(), n * sizeof(float)) == 0);
    const size_t lo = cut[size_t(me)], hi = cut[size_t(me) + 1];
    CHECK(std::memcmp(z.data() + lo, ref.data() + lo, (hi - lo) * sizeof(float)) == 0);
    // The other ranks' pieces are only read.
    CHECK(std::memcmp(z.data(), mine.data(), lo * sizeof(float)) == 0);
    CHECK(std::memcmp(z.data() + hi, mine.data() + hi, (n - hi) * sizeof(float)) == 0);
  }
}

TEST_CASE(
    "SumOrder::rank: all-reduces and reduces of sizes not a multiple of the ranks, fewer "
    "elements than ranks included",
    "[comm]") {
  auto c = dup_world(CommKind::dp);
  const int p = c->size(), me = c->rank();
  // Each rank sums a part of each chunk of 128Ki floats (parts of at least
  // 4Ki, src/comm/mpi/ordered_sum.cpp): parts left empty, a short last
  // chunk, more chunks than the 4 in flight.
  const size_t chunk = std::max<size_t>(131072, 4096 * size_t(p));
  for (size_t n : {size_t(1), size_t(2), size_t(p - 1 > 0 ? p - 1 : 1), size_t(p + 1),
                   size_t(1000 * p + 3), chunk + 1, 6 * chunk - 5}) {
    const uint64_t key = rng::hash_name("ordered-sum-uneven") + n;
    std::vector<float> mine(n), ref(n);
    for (size_t i = 0; i < n; ++i) {
      mine[i] = input(me, i, key);
      ref[i] = rank_order_sum(p, i, key);
    }
    std::vector<float> x = mine;
    c->allreduce_sum(x.data(), n, SumOrder::rank);
    CHECK(std::memcmp(x.data(), ref.data(), n * sizeof(float)) == 0);

    const int root = p - 1;
    std::vector<float> y = mine;
    Request r = c->ireduce_sum(y.data(), n, root, SumOrder::rank);
    c->wait(r);
    // The root holds the sum; the others' buffers are only read.
    CHECK(std::memcmp(y.data(), (me == root ? ref : mine).data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("SumOrder::rank sums do not meet point-to-point messages of the same communicator",
          "[comm]") {
  auto c = dup_world(CommKind::dp);
  const int p = c->size(), me = c->rank();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  const size_t n = 3 * 65536 + 11;
  const uint64_t key = rng::hash_name("ordered-sum-p2p");
  std::vector<float> x(n), ref(n), out(n), in(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    x[i] = input(me, i, key);
    ref[i] = rank_order_sum(p, i, key);
    out[i] = input(me, i, key + 1);
  }
  // Tags 0..7 are those the first ordered sum of a communicator would use
  // on its own messages.
  std::vector<Request> reqs;
  for (int tag = 0; tag < 8; ++tag) {
    const size_t lo = n * size_t(tag) / 8, len = n * size_t(tag + 1) / 8 - lo;
    reqs.push_back(c->irecv(in.data() + lo, len * sizeof(float), prev, tag));
  }
  Request sum = c->iallreduce_sum(x.data(), n, SumOrder::rank);
  for (int tag = 0; tag < 8; ++tag) {
    const size_t lo = n * size_t(tag) / 8, len = n * size_t(tag + 1) / 8 - lo;
    reqs.push_back(c->isend(out.data() + lo, len * sizeof(float), next, tag));
  }
  c->wait(sum);
  c->wait_all(reqs);
  CHECK(std::memcmp(x.data(), ref.data(), n * sizeof(float)) == 0);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    if (in[i] != input(prev, i, key + 1)) ++bad;
  CHECK(bad == 0);
}

TEST_CASE("allreduce on double, int64, max, min", "[comm]") {
  auto c = dup_world(CommKind::cp);
  const int p = c->size(), me = c->rank();
  const size_t n = 513;
  const uint64_t key = rng::hash_name("allreduce-double");
  std::vector<double> s(n), mx(n), mn(n);
  std::vector<int64_t> k(n);
  std::vector<int> im(n);
  for (size_t i = 0; i < n; ++i) {
    s[i] = mx[i] = mn[i] = input(me, i, key);
    k[i] = int64_t(rng::bits(key + uint64_t(me), i) >> 20);  // big, exact in int64 sums
    im[i] = int(rng::below(key + 99 + uint64_t(me), i, 1000000));
  }
  c->allreduce_sum(s.data(), n);
  c->allreduce_max(mx.data(), n);
  c->allreduce_min(mn.data(), n);
  c->allreduce_sum(k.data(), n);
  c->allreduce_max(im.data(), n);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    double rs = 0, rmx = -1e30, rmn = 1e30;
    int64_t rk = 0;
    int rim = -1;
    for (int r = 0; r < p; ++r) {
      const double v = input(r, i, key);
      rs += v;
      rmx = std::max(rmx, v);
      rmn = std::min(rmn, v);
      rk += int64_t(rng::bits(key + uint64_t(r), i) >> 20);
      rim = std::max(rim, int(rng::below(key + 99 + uint64_t(r), i, 1000000)));
    }
    if (std::fabs(s[i] - rs) > 1e-12 * p) ++bad;
    if (mx[i] != rmx || mn[i] != rmn || k[i] != rk || im[i] != rim) ++bad;
  }
  CHECK(bad == 0);
}

TEST_CASE("allgather and broadcast place every rank's bytes", "[comm]") {
  auto c = dup_world(CommKind::ep);
  const int p = c->size(), me = c->rank();
  const size_t n = 301;  // floats per rank
  const uint64_t key = rng::hash_name("allgather");
  std::vector<float> mine(n), all(n * p, 0.0f);
  for (size_t i = 0; i < n; ++i) mine[i] = input(me, i, key);
  c->allgather(mine.data(), all.data(), n * sizeof(float));
  size_t bad = 0;
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < n; ++i)
      if (all[r * n + i] != input(r, i, key)) ++bad;
  CHECK(bad == 0);

  for (int root = 0; root < p; ++root) {
    std::vector<float> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = me == root ? input(root, i, key + 1) : -7.0f;
    c->broadcast(b.data(), n * sizeof(float), root);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i)
      if (b[i] != input(root, i, key + 1)) ++wrong;
    CHECK(wrong == 0);
  }
}

TEST_CASE("gather_bytes_to_root: every rank's bytes of any length on each root, in rank order",
          "[comm]") {
  auto c = dup_world(CommKind::dp);
  const int p = c->size(), me = c->rank();
  // rank r sends 37 * r bytes (rank 0: none) of a pattern of its own
  auto bytes_of = [](int r) {
    std::vector<char> b(size_t(37 * r));
    for (size_t i = 0; i < b.size(); ++i) b[i] = char((r * 131 + int(i) * 7) & 0x7f);
    return b;
  };
  for (int root = 0; root < p; ++root) {
    const std::vector<std::vector<char>> got = gather_bytes_to_root(*c, bytes_of(me), root, 7500);
    if (me != root) {
      CHECK(got.empty());
      continue;
    }
    REQUIRE(got.size() == size_t(p));
    for (int r = 0; r < p; ++r) CHECK(got[size_t(r)] == bytes_of(r));
  }
}

TEST_CASE("gather_bytes_to_root: a rank that never sends ends the root's wait at the deadline",
          "[comm]") {
  auto c = dup_world(CommKind::dp, 0.5);
  const int p = c->size(), me = c->rank();
  if (p < 2) return;
  // the sizes agree (the allgather), then rank 1 sends nothing on the tag
  std::vector<int64_t> sizes(size_t(p), 8);
  const int64_t mine = 8;
  std::string msg;
  try {
    if (me == 1) {
      c->allgather(&mine, sizes.data(), sizeof mine);
    } else {
      gather_bytes_to_root(*c, std::vector<char>(8, 'x'), 0, 7501);
    }
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  INFO(msg);
  if (me == 0) {
    CHECK(msg.find("recv of 8 B from rank 1") != std::string::npos);
    CHECK(msg.find("timed out after 0.5s") != std::string::npos);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // not c's: its deadline passes while rank 0 waits
}

TEST_CASE("alltoallv with uneven and zero counts, and gaps between blocks", "[comm]") {
  auto c = dup_world(CommKind::ep);
  const int p = c->size(), me = c->rank();
  // Elements sent from s to d: 0..5, zero for several pairs (always for s = 0
  // to the last rank, and for all of rank 1's sends when p > 2).
  auto count = [&](int s, int d) -> int64_t {
    if (s == 0 && d == p - 1) return 0;
    if (p > 2 && s == 1) return 0;
    return (s * 7 + d * 3 + 1) % 6;
  };
  // value sent s -> d at index j: encodes all three, exact in double.
  auto value = [](int s, int d, int64_t j) {
    return double(s) * 1e6 + double(d) * 1e3 + double(j);
  };
  // Elements of 3 doubles (24 B) so elem_bytes is not a power of two.
  constexpr size_t kElem = 3;
  std::vector<int64_t> sc(p), sd(p), rc(p), rd(p);
  int64_t off = 0;
  for (int d = 0; d < p; ++d) {
    sc[d] = count(me, d);
    sd[d] = off;
    off += sc[d] + 1;  // one-element gap after each block
  }
  std::vector<double> send(size_t(off) * kElem);
  for (int d = 0; d < p; ++d)
    for (int64_t j = 0; j < sc[d]; ++j)
      for (size_t e = 0; e < kElem; ++e) send[(sd[d] + j) * kElem + e] = value(me, d, j) + 0.25 * e;
  int64_t roff = 0;
  for (int s = 0; s < p; ++s) {
    rc[s] = count(s, me);
    rd[s] = roff;
    roff += rc[s] + 2;
  }
  const double sentinel = -12345.0;
  std::vector<double> recv(size_t(roff) * kElem, sentinel);

  const CommCounters before = c->counters();
  c->alltoallv(send.data(), sc, sd, recv.data(), rc, rd, kElem * sizeof(double));
  const CommCounters delta = c->counters() - before;

  size_t bad = 0;
  for (int s = 0; s < p; ++s) {
    for (int64_t j = 0; j < rc[s]; ++j)
      for (size_t e = 0; e < kElem; ++e)
        if (recv[(rd[s] + j) * kElem + e] != value(s, me, j) + 0.25 * e) ++bad;
    // The gaps stay untouched.
    for (int64_t g = rc[s]; g < rc[s] + 2; ++g)
      for (size_t e = 0; e < kElem; ++e)
        if (recv[(rd[s] + g) * kElem + e] != sentinel) ++bad;
  }
  CHECK(bad == 0);
  double expect_bytes = 0;
  for (int d = 0; d < p; ++d)
    if (d != me) expect_bytes += double(sc[d]) * kElem * sizeof(double);
  CHECK(delta.bytes_sent[int(CommKind::ep)] == expect_bytes);
  CHECK(delta.calls[int(CommKind::ep)] == 1);
}

TEST_CASE("alltoall of int64 per peer", "[comm]") {
  auto c = dup_world(CommKind::ep);
  const int p = c->size(), me = c->rank();
  const size_t per = 3;
  std::vector<int64_t> s(per * p), r(per * p, -1);
  for (int d = 0; d < p; ++d)
    for (size_t j = 0; j < per; ++j) s[d * per + j] = int64_t(me) * 100000 + d * 100 + int64_t(j);
  c->alltoall(s.data(), r.data(), per);
  size_t bad = 0;
  for (int src = 0; src < p; ++src)
    for (size_t j = 0; j < per; ++j)
      if (r[src * per + j] != int64_t(src) * 100000 + me * 100 + int64_t(j)) ++bad;
  CHECK(bad == 0);
}

TEST_CASE("ring isend/irecv delivers and the counters equal the bytes sent", "[comm]") {
  auto c = dup_world(CommKind::cp);
  const int p = c->size(), me = c->rank();
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  const size_t n = 4099;
  const uint64_t key = rng::hash_name("ring");
  std::vector<float> out(n), in(n, 0.0f), out2(17), in2(17, 0.0f);
  for (size_t i = 0; i < n; ++i) out[i] = input(me, i, key);
  for (size_t i = 0; i < 17; ++i) out2[i] = input(me, i, key + 5);

  const CommCounters before = c->counters();
  std::vector<Request> reqs;
  reqs.push_back(c->irecv(in.data(), n * sizeof(float), prev, 1));
  reqs.push_back(c->irecv(in2.data(), 17 * sizeof(float), prev, 2));
  // Tag 2 goes first: tags separate the two streams whatever the order.
  reqs.push_back(c->isend(out2.data(), 17 * sizeof(float), next, 2));
  reqs.push_back(c->isend(out.data(), n * sizeof(float), next, 1));
  // Poll one with test() until done, wait for the rest.
  while (!c->test(reqs[0])) {
  }
  CHECK_FALSE(reqs[0].active());
  c->wait_all(reqs);
  for (auto& r : reqs) CHECK_FALSE(r.active());
  const CommCounters delta = c->counters() - before;

  size_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    if (in[i] != input(prev, i, key)) ++bad;
  for (size_t i = 0; i < 17; ++i)
    if (in2[i] != input(prev, i, key + 5)) ++bad;
  CHECK(bad == 0);
  CHECK(delta.bytes_sent[int(CommKind::cp)] == double((n + 17) * sizeof(float)));
  CHECK(delta.calls[int(CommKind::cp)] == 4);
  for (int k : {int(CommKind::pp), int(CommKind::ep), int(CommKind::dp)})
    CHECK(delta.bytes_sent[k] == 0.0);
  CHECK(delta.wait_s[int(CommKind::cp)] >= 0.0);
}

TEST_CASE("collective byte counters: allreduce, allgather, broadcast", "[comm]") {
  auto c = dup_world(CommKind::pp);
  const int me = c->rank();
  std::vector<double> x(100, 1.5);
  std::vector<char> g(40), all(40 * size_t(c->size()));
  const CommCounters before = c->counters();
  c->allreduce_sum(x.data(), x.size());
  c->allgather(g.data(), all.data(), g.size());
  c->broadcast(x.data(), 64, 0);
  const CommCounters delta = c->counters() - before;
  const double expect = 100 * sizeof(double) + 40 + (me == 0 ? 64 : 0);
  CHECK(delta.bytes_sent[int(CommKind::pp)] == expect);
  CHECK(delta.calls[int(CommKind::pp)] == 3);
}

TEST_CASE("a receive nobody sends ends in a TimeoutError naming rank, op and peer", "[comm]") {
  auto c = dup_world(CommKind::pp, 0.5);
  const int p = c->size(), me = c->rank();
  const int peer = (me + 1) % p;
  float buf[4];
  Request r = c->irecv(buf, sizeof buf, peer, 999);
  const double t0 = MPI_Wtime();
  std::string msg;
  try {
    c->wait(r);
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  const double waited = MPI_Wtime() - t0;
  INFO(msg);
  REQUIRE_FALSE(msg.empty());
  CHECK(waited >= 0.5);
  CHECK(msg.find("rank " + std::to_string(world_rank()) + ":") == 0);
  CHECK(msg.find("recv of 16 B from rank " + std::to_string(peer)) != std::string::npos);
  CHECK(msg.find("(pp)") != std::string::npos);
  CHECK(msg.find("timed out after 0.5s") != std::string::npos);
  // The abandoned receive is cancelled when the Request goes away; the
  // communicator still works afterwards.
  r = Request();
  c->barrier();
}

TEST_CASE("world_rank_of maps group ranks back to world ranks", "[comm]") {
  // Split world into even and odd ranks, reversed order within each.
  MPI_Comm sub;
  const int wr = world_rank(), ws = world_size();
  MPI_Comm_split(MPI_COMM_WORLD, wr % 2, ws - wr, &sub);
  MpiCommunicator c(sub, CommKind::dp, "parity", 30.0, true);
  std::vector<int> expect;
  for (int r = ws - 1; r >= 0; --r)
    if (r % 2 == wr % 2) expect.push_back(r);
  REQUIRE(c.size() == int(expect.size()));
  for (int i = 0; i < c.size(); ++i) CHECK(c.world_rank_of(i) == expect[i]);
}

TEST_CASE("now_s is one clock: after sync, every rank's reading after a barrier is close",
          "[comm]") {
  MpiCommunicator world(MPI_COMM_WORLD, CommKind::world, "world", 30.0, false);
  sync_clock(world);
  auto c = dup_world(CommKind::world);
  // Readings taken after a barrier by all ranks lie within the barrier's
  // exit skew; a missing offset of seconds would show.
  c->barrier();
  double t = now_s();
  double lo = t, hi = t;
  c->allreduce_min(&lo, 1);
  c->allreduce_max(&hi, 1);
  CHECK(hi - lo < 1.0);
  CHECK(now_s() >= t);
}

TEST_CASE("now_s on one host is one clock: a reading after a message is never before the sender's",
          "[comm][multirank]") {
  MpiCommunicator world(MPI_COMM_WORLD, CommKind::world, "world", 30.0, false);
  sync_clock(world);
  auto c = dup_world(CommKind::world);
  REQUIRE(c->size() >= 2);  // nothing to compare on 1 (not registered at np 1)
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  const double host = double(rng::hash_name(name) % (uint64_t(1) << 52));
  // A token goes round the ranks many times; each rank reads the clock right
  // after it arrives. Message latency on one host is a few microseconds, so
  // a clock offset error of that size already reverses the order.
  int same_host_pairs = 0, reversed = 0;
  double worst = 0;
  for (int round = 0; round < 200; ++round) {
    double token[2] = {0, 0};  // reading, host of the reader
    const int r = c->rank(), n = c->size();
    if (r == 0 && round == 0) token[0] = now_s(), token[1] = host;
    if (r != 0 || round > 0) {
      Request rq = c->irecv(token, sizeof token, (r - 1 + n) % n, 77);
      c->wait(rq);
      const double t = now_s();
      if (token[1] == host) {
        ++same_host_pairs;
        if (t < token[0]) ++reversed, worst = std::max(worst, token[0] - t);
      }
      token[0] = t, token[1] = host;
    }
    if (!(r == n - 1 && round == 199)) {
      Request sq = c->isend(token, sizeof token, (r + 1) % n, 77);
      c->wait(sq);
    }
  }
  INFO("readings earlier than the sender's: " << reversed << " of " << same_host_pairs
                                              << ", by up to " << worst * 1e6 << " us");
  CHECK(reversed == 0);
  int pairs = same_host_pairs;
  c->allreduce_max(&pairs, 1);
  if (pairs == 0) WARN("no two consecutive ranks share a host: nothing compared");
}

TEST_CASE("counters belong to a set of communicators: a split adds to its parent's", "[comm]") {
  auto a = dup_world(CommKind::pp);
  auto b = dup_world(CommKind::pp);  // another set
  auto sub = a->split(0, a->rank(), CommKind::dp, "sub");
  REQUIRE(sub);
  const CommCounters a0 = a->counters(), b0 = b->counters();
  float x[3] = {1.f, 2.f, 3.f};
  sub->allreduce_sum(x, 3);
  CHECK((a->counters() - a0).bytes_sent[int(CommKind::dp)] == 3 * sizeof(float));
  CHECK((sub->counters() - a0).bytes_sent[int(CommKind::dp)] == 3 * sizeof(float));
  CHECK((b->counters() - b0).calls[int(CommKind::dp)] == 0);
  b->allreduce_sum(x, 3);
  CHECK((b->counters() - b0).bytes_sent[int(CommKind::pp)] == 3 * sizeof(float));
  CHECK((a->counters() - a0).calls[int(CommKind::pp)] == 0);
}
