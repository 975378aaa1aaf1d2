// MPI on device buffers: a communicator given the emulated device's staging
// (stage_device_buffers) moves buffers that live in the device's arena
// through host copies, and every collective and point-to-point operation
// gives the same bytes as on host buffers. Without the staging, MPI itself
// would touch the arena and the process would stop (the arena's guard).
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>
#include <vector>

#include "mpi_test_util.hpp"
#include "trident/comm/comm.hpp"
#include "trident/comm/mpi/mpi_communicator.hpp"
#include "trident/core/emulated.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/staging.hpp"
#include "trident/kernels/tensor_ops.hpp"

using namespace trident;

namespace {

const kernels::Ctx& dev() {
  static kernels::DeviceContext device(Device::emulated());
  return device.ctx();
}

// A staged duplicate of world, and a group split off it (which inherits
// the staging).
std::unique_ptr<Communicator> staged_world() {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  auto comm = std::make_unique<MpiCommunicator>(c, CommKind::dp, "staged", 30.0, true);
  comm->stage_device_buffers(kernels::device_staging(dev()));
  return comm;
}

Tensor host_randn(int64_t n, const char* name, int rank) {
  Tensor t(std::vector<int64_t>{n});
  rng::fill_normal(t.ptr(), n, rng::combine(rng::hash_name(name), uint64_t(rank)), 0, 1.0f);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.bytes()) == 0;
}

}  // namespace

TEST_CASE("collectives on emulated buffers equal those on host buffers", "[comm][emulated]") {
  auto comm = staged_world();
  auto group = comm->split(0, comm->rank(), CommKind::ep, "staged-split");
  const int p = comm->size(), me = comm->rank();
  for (Communicator* c : {comm.get(), group.get()}) {
    for (int64_t n : {int64_t(1), int64_t(1000), int64_t(65537)}) {
      Tensor h = host_randn(n, "staged.allreduce", me);
      Tensor d = kernels::clone(dev(), h);
      REQUIRE(emulated::contains(d.data_ptr()));
      c->allreduce_sum(h.ptr(), size_t(n));
      c->allreduce_sum(d.ptr(), size_t(n));
      CHECK(same_bits(kernels::to_host(dev(), d), h));
    }
    // broadcast from the last rank
    Tensor hb = host_randn(333, "staged.bcast", me);
    Tensor db = kernels::clone(dev(), hb);
    c->broadcast(hb.data_ptr(), hb.bytes(), p - 1);
    c->broadcast(db.data_ptr(), db.bytes(), p - 1);
    CHECK(same_bits(kernels::to_host(dev(), db), hb));
    CHECK(same_bits(hb, host_randn(333, "staged.bcast", p - 1)));
    // allgather: device in, host out; and device both ways
    const Tensor hg = host_randn(50, "staged.gather", me);
    const Tensor dg = kernels::clone(dev(), hg);
    Tensor out_h(std::vector<int64_t>{50 * p}), out_mixed(std::vector<int64_t>{50 * p});
    Tensor out_d = kernels::empty(dev(), {50 * p});
    c->allgather(hg.data_ptr(), out_h.data_ptr(), hg.bytes());
    c->allgather(dg.data_ptr(), out_mixed.data_ptr(), dg.bytes());
    c->allgather(dg.data_ptr(), out_d.data_ptr(), dg.bytes());
    CHECK(same_bits(out_mixed, out_h));
    CHECK(same_bits(kernels::to_host(dev(), out_d), out_h));
    for (int r = 0; r < p; ++r)
      CHECK(same_bits(out_h.rows(50 * r, 50 * (r + 1)), host_randn(50, "staged.gather", r)));
  }
}

TEST_CASE("rank-ordered sums on emulated buffers equal those on host buffers", "[comm][emulated]") {
  auto c = staged_world();
  const int p = c->size(), me = c->rank();
  const int64_t block = 70001;  // more than one chunk of the chain
  Tensor h = host_randn(block * p, "staged.ordered", me);
  Tensor d = kernels::clone(dev(), h);
  Tensor hs(std::vector<int64_t>{block});
  Tensor ds = kernels::empty(dev(), {block});
  c->reduce_scatter_sum(h.ptr(), hs.ptr(), size_t(block), SumOrder::rank);
  c->reduce_scatter_sum(d.ptr(), ds.ptr(), size_t(block), SumOrder::rank);
  CHECK(same_bits(kernels::to_host(dev(), ds), hs));
  Request rh = c->iallreduce_sum(h.ptr(), size_t(block * p), SumOrder::rank);
  Request rd = c->iallreduce_sum(d.ptr(), size_t(block * p), SumOrder::rank);
  c->wait(rd);
  c->wait(rh);
  CHECK(same_bits(kernels::to_host(dev(), d), h));
  // The reduce-scatter's block is the all-reduce's, bit for bit.
  CHECK(std::memcmp(hs.data_ptr(), h.ptr() + block * me, size_t(block) * sizeof(float)) == 0);
}

TEST_CASE("alltoallv on emulated buffers equals the host one", "[comm][emulated]") {
  auto comm = staged_world();
  const int p = comm->size(), me = comm->rank();
  // rank me sends (me + r) % 3 + 1 rows of 4 floats to rank r, after a gap
  const int64_t row = 4;
  std::vector<int64_t> sc(static_cast<size_t>(p)), sd(sc), rc(sc), rd(sc);
  int64_t s_end = 2, r_end = 0;  // two rows that nobody sends, before the first block
  for (int r = 0; r < p; ++r) {
    sc[size_t(r)] = ((me + r) % 3 + 1) * row;
    sd[size_t(r)] = s_end * row;
    s_end += sc[size_t(r)] / row;
    rc[size_t(r)] = ((r + me) % 3 + 1) * row;
    rd[size_t(r)] = r_end * row;
    r_end += rc[size_t(r)] / row;
  }
  const Tensor send_h = host_randn(s_end * row, "staged.a2a", me);
  const Tensor send_d = kernels::clone(dev(), send_h);
  Tensor recv_h(std::vector<int64_t>{r_end * row});
  Tensor recv_d = kernels::zeros(dev(), {r_end * row});
  comm->alltoallv(send_h.data_ptr(), sc, sd, recv_h.data_ptr(), rc, rd, sizeof(float));
  comm->alltoallv(send_d.data_ptr(), sc, sd, recv_d.data_ptr(), rc, rd, sizeof(float));
  CHECK(same_bits(kernels::to_host(dev(), recv_d), recv_h));
}

TEST_CASE("point-to-point on emulated buffers around a ring", "[comm][emulated]") {
  auto comm = staged_world();
  const int p = comm->size(), me = comm->rank();
  const Tensor mine = host_randn(1025, "staged.ring", me);
  const Tensor mine_d = kernels::clone(dev(), mine);
  Tensor got_d = kernels::zeros(dev(), {1025});
  Tensor got_h(std::vector<int64_t>{1025});
  std::vector<Request> rs;
  comm->begin_group();
  rs.push_back(comm->irecv(got_d.data_ptr(), got_d.bytes(), (me + p - 1) % p, 1));
  rs.push_back(comm->irecv(got_h.data_ptr(), got_h.bytes(), (me + p - 1) % p, 2));
  rs.push_back(comm->isend(mine_d.data_ptr(), mine_d.bytes(), (me + 1) % p, 1));
  rs.push_back(comm->isend(mine.data_ptr(), mine.bytes(), (me + 1) % p, 2));
  comm->end_group();
  comm->wait_all(rs);
  const Tensor want = host_randn(1025, "staged.ring", (me + p - 1) % p);
  CHECK(same_bits(kernels::to_host(dev(), got_d), want));
  CHECK(same_bits(got_h, want));
}
