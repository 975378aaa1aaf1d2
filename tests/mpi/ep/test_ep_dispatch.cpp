// TokenDispatcher under MPI: identity experts round-trip tokens exactly,
// bytes equal the routed copies, empty ranks and experts are normal, and
// capacity drops with ep equal the one-rank drops of the same tokens.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "../../unit/ep/ep_test_util.hpp"
#include "ep_fixtures.hpp"
#include "ep_mesh.hpp"
#include "trident/core/tensor.hpp"
#include "trident/parallel/ep/moe_layer.hpp"
#include "trident/parallel/ep/token_dispatcher.hpp"
#include "trident/parallel/ep/transport.hpp"

using namespace trident;
using namespace trident::ep;
using trident::testing::block_row;
using trident::testing::host_flat;
using trident::testing::host_rows;
using trident::testing::randn;

namespace {

// Dispatch, identity experts, combine with weights 1/k; then the backward
// the same way. Returns y and dx.
void identity_round_trip(TokenDispatcher& disp, const std::vector<int>& expert,
                         const std::vector<float>& x, const std::vector<float>& dy, int64_t T,
                         int k, int64_t d, std::vector<float>& y, std::vector<float>& dx,
                         DispatchPlan& plan, prof::Recorder& forward) {
  disp.set_profiler(&forward);  // the forward's transfers only
  plan = disp.plan(expert, T, k);
  const int64_t S = plan.sent(), R = plan.received();
  std::vector<float> at_expert(R * d);
  disp.dispatch(plan, host_rows(x, d), host_rows(at_expert, d));
  std::vector<float> w(T * k, 1.0f / float(k));
  y.assign(T * d, -1.0f);
  KeptRows keep;
  disp.combine(plan, host_rows(at_expert, d), host_flat(w), host_rows(y, d), &keep);
  disp.set_profiler(nullptr);
  // Backward: the combine's gradient travels like a dispatch, and back.
  std::vector<float> drows(S * d), dw(T * k), dexp(R * d);
  disp.combine_backward(plan, host_rows(at_expert, d), host_rows(dy, d), host_flat(w),
                        host_rows(drows, d), host_flat(dw), &keep);
  disp.dispatch_rows(plan, host_rows(drows, d), host_rows(dexp, d));
  dx.assign(T * d, -1.0f);
  disp.combine(plan, host_rows(dexp, d), Tensor(), host_rows(dx, d));
}

const char* const kTransports[] = {"alltoallv", "shm"};

}  // namespace

TEST_CASE("identity experts round-trip tokens exactly; bytes equal the routed copies", "[ep]") {
  const int W = testing::world_size(), rank = testing::world_rank();
  eptest::EpMesh mesh(W, 1);
  const int E = 8 * W, d = 12;
  for (int k : {1, 2, 4}) {
    // Rank 1 holds no tokens at all (when there is one).
    const int64_t T = rank == 1 ? 0 : 17 + 3 * rank;
    std::vector<int> expert(T * k);
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j)  // k distinct experts per token
        expert[t * k + j] = int((rng::below(rng::hash_name("route"), uint64_t(rank * 1000 + t), E) +
                                 uint64_t(j) * (E / k)) %
                                E);
    auto x = randn(T * d, "rt_x", 1.0f, uint64_t(rank) << 20);
    auto dy = randn(T * d, "rt_dy", 1.0f, uint64_t(rank) << 20);
    for (const char* tr : kTransports) {
      TokenDispatcher disp(mesh.ep_comm.get(), E, *parse_config_name<EpTransportChoice>(tr));
      std::vector<float> y, dx;
      DispatchPlan plan;
      prof::Recorder times;
      const CommCounters before = mesh.ep_comm->counters();
      identity_round_trip(disp, expert, x, dy, T, k, d, y, dx, plan, times);
      const CommCounters moved_by_rank = mesh.ep_comm->counters() - before;
      INFO("k " << k << " transport " << tr << " rank " << rank);
      CHECK(y == x);    // k copies of x/k: exact for k in {1, 2, 4}
      CHECK(dx == dy);  // k copies of dy/k gathered back
      CHECK(plan.sent() == T * k);
      if (W > 1)
        CHECK(times.counter("ep.bytes") ==
              double(plan.sent() + plan.received()) * d * sizeof(float));
      // The ep counters see what leaves the rank: forward and backward, both
      // directions, plus the count exchange (E counts); the same whichever
      // transport moved the rows, but for one int each time the shm blocks grow.
      const double row_bytes = double(d) * sizeof(float);
      const double sent_off = double(plan.sent() - plan.send_rows[rank]) * row_bytes;
      const double recv_off = double(plan.received() - plan.recv_rows[rank]) * row_bytes;
      const double expected = W == 1 ? 0.0
                                     : 2 * (sent_off + recv_off) + E * sizeof(int64_t) +
                                           disp.shm_growths() * sizeof(int);
      if (std::string(tr) == "shm" && W > 1) CHECK(disp.shm_growths() == 1);
      CHECK(moved_by_rank.bytes_sent[int(CommKind::ep)] == expected);
      int64_t moved[2] = {plan.sent(), plan.received()};
      mesh.world->allreduce_sum(moved, 2);
      CHECK(moved[0] == moved[1]);
      // What this rank received for each local expert is what the senders routed there.
      std::vector<int64_t> per_expert(E, 0);
      for (int e : expert) per_expert[e]++;
      mesh.world->allreduce_sum(per_expert.data(), per_expert.size());
      for (int e = 0; e < plan.local_experts; ++e) {
        int64_t got = 0;
        for (int r = 0; r < W; ++r) got += plan.chunk_rows[r * plan.local_experts + e];
        CHECK(got == per_expert[plan.first_local_expert() + e]);
      }
    }
  }
}

TEST_CASE("every token on the last rank's expert: other ranks and experts receive nothing",
          "[ep]") {
  const int W = testing::world_size(), rank = testing::world_rank();
  eptest::EpMesh mesh(W, 1);
  const int E = 2 * W, d = 8, k = 1;
  const int64_t T = 9;
  std::vector<int> expert(T, E - 1);
  auto x = randn(T * d, "one_x", 1.0f, uint64_t(rank) << 20);
  auto dy = randn(T * d, "one_dy", 1.0f, uint64_t(rank) << 20);
  for (const char* tr : kTransports) {
    TokenDispatcher disp(mesh.ep_comm.get(), E, *parse_config_name<EpTransportChoice>(tr));
    std::vector<float> y, dx;
    DispatchPlan plan;
    prof::Recorder times;
    identity_round_trip(disp, expert, x, dy, T, k, d, y, dx, plan, times);
    INFO("transport " << tr << " rank " << rank);
    CHECK(y == x);
    CHECK(dx == dy);
    CHECK(plan.received() == (rank == W - 1 ? T * W : 0));
    if (rank == W - 1) CHECK(plan.chunk_rows[0 * 2 + 0] == 0);  // expert E-2 got nothing
  }
}

TEST_CASE("forwards in flight keep their rows until released, slots are reused", "[ep]") {
  // As under a pipeline schedule: several forwards of one layer before their
  // backwards, released out of order, new forwards in between.
  const int W = testing::world_size(), rank = testing::world_rank();
  eptest::EpMesh mesh(W, 1);
  const int E = 4 * W, d = 6, k = 2;
  for (const char* tr : kTransports) {
    TokenDispatcher disp(mesh.ep_comm.get(), E, *parse_config_name<EpTransportChoice>(tr));
    struct Fwd {
      std::vector<float> x;
      DispatchPlan plan;
      std::unique_ptr<ForwardRows> rows;
    };
    std::vector<Fwd> live;
    // Forward i: its own tokens and routing (more tokens later, so slots grow).
    auto forward = [&](int i) {
      Fwd f;
      const int64_t T = 5 + 4 * i + rank;
      std::vector<int> expert(T * k);
      for (int64_t t = 0; t < T; ++t)
        for (int j = 0; j < k; ++j)
          expert[t * k + j] =
              int((rng::below(rng::hash_name("slots"), uint64_t(i * 7919 + rank * 131 + t), E) +
                   uint64_t(j) * (E / k)) %
                  E);
      f.x = randn(T * d, "slots_x", 1.0f, (uint64_t(rank) << 24) + uint64_t(i) * 1000);
      f.plan = disp.plan(expert, T, k);
      f.rows = disp.dispatch_forward(f.plan, host_rows(f.x, d));
      const int64_t R = f.plan.received();
      // The expert: out = 2 * in. The combine of weights 1/2 gives 2 x, exactly.
      Tensor out = f.rows->out();
      for (int64_t i2 = 0; i2 < R * d; ++i2) out[i2] = 2.0f * f.rows->in()[i2];
      std::vector<float> w(T * k, 0.5f), y(T * d, -1.0f);
      disp.combine_forward(f.plan, *f.rows, host_flat(w), host_rows(y, d));
      int64_t bad = 0;
      for (int64_t i2 = 0; i2 < T * d; ++i2) bad += y[i2] != 2.0f * f.x[i2];
      CHECK(bad == 0);
      return f;
    };
    // What the backward sees: every copy's row is 2 x[t], however many
    // forwards came after.
    auto check_visit = [&](Fwd& f) {
      int64_t bad = 0;
      const kernels::RowBlocks& rows = f.rows->returned();
      for (int64_t t = 0; t < f.plan.T; ++t)
        for (int j = 0; j < k; ++j)
          for (int c = 0; c < d; ++c)
            bad += block_row(rows, f.plan.row_of.data<int64_t>()[t * k + j], d)[c] !=
                   2.0f * f.x[t * d + c];
      CHECK(bad == 0);
    };
    INFO("transport " << tr << " rank " << rank);
    for (int i = 0; i < 3; ++i) live.push_back(forward(i));
    for (auto& f : live) check_visit(f);
    live.erase(live.begin() + 1);  // the middle one finishes first
    live.push_back(forward(3));    // may reuse its slot after the count exchange
    live.push_back(forward(4));
    for (auto& f : live) check_visit(f);
    live.clear();
    live.push_back(forward(5));
    check_visit(live.back());
  }
}

TEST_CASE("shm: a dispatch leaves alone the rows peers still read from the last gather_back",
          "[ep][multirank]") {
  // The backward's two transfers of one micro-batch (dispatch, gather_back)
  // and then the next micro-batch's, with no count exchange in between (the
  // plans were made in the forwards), as schedules that run backwards back to
  // back do. A gather_back's rows stay in the expert rank's outbox until each
  // source has read them; the next dispatch writes the inboxes, whose rows
  // can reach into the last outboxes when the plans differ.
  const int W = testing::world_size(), rank = testing::world_rank();
  REQUIRE(W > 1);  // a peer writes while another reads (not registered at np 1)
  eptest::EpMesh mesh(W, 1);
  const int E = W, d = 16;
  // Every copy goes to expert 1 (rank 1's block). Plan a: 8 tokens per rank,
  // so rank 1's outbox is rows [8W, 16W) of its block; plan b: 32W per rank,
  // so rank 0's rows in b fill rows [0, 32W) of rank 1's inbox.
  TokenDispatcher planner(mesh.ep_comm.get(), E, EpTransportChoice::alltoallv);
  const auto plan_of = [&](int64_t T) {
    const std::vector<int> expert(size_t(T), 1);
    return planner.plan(expert, T, 1);
  };
  const DispatchPlan a = plan_of(8), b = plan_of(32 * W);
  const auto xa = randn(a.T * d, "overlap_a", 1.0f, uint64_t(rank) << 20);
  const auto xb = randn(b.T * d, "overlap_b", 1.0f, uint64_t(rank) << 20);
  std::unique_ptr<Transport> shm = make_shm_transport(*mesh.ep_comm, 0, kernels::Ctx{});
  // Identity experts: each copy comes back as it went. `slow`: rank 1 reads
  // its rows 0.3 s after the others, who go on to their next dispatch.
  const auto round_trip = [&](const DispatchPlan& p, const std::vector<float>& x, bool slow) {
    std::vector<float> expert_side(size_t(p.received() * d));
    shm->dispatch(p, SendRows{host_rows(x, d), p.send_token}, host_rows(expert_side, d));
    const kernels::RowBlocks back = shm->gather_back(p, host_rows(expert_side, d), nullptr);
    if (slow && rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    bool same = true;
    for (int64_t i = 0; i < p.sent(); ++i) {
      const int64_t t = p.send_token.data<int64_t>()[i];
      same = same && std::equal(x.begin() + t * d, x.begin() + (t + 1) * d, block_row(back, i, d));
    }
    return same;
  };
  REQUIRE(shm->kind() == EpTransport::shm);
  CHECK(round_trip(b, xb, false));  // grows the blocks to b's size: no growth below
  const int growths = shm->shared_memory().growths;
  INFO("rank " << rank);
  CHECK(round_trip(a, xa, true));
  CHECK(round_trip(b, xb, false));
  CHECK(shm->shared_memory().growths == growths);
}

TEST_CASE("past runtime.ep_shm_limit_mb the exchange falls back to alltoallv, same results",
          "[ep][multirank]") {
  const int W = testing::world_size(), rank = testing::world_rank();
  REQUIRE(W > 1);  // one rank exchanges nothing (not registered at np 1)
  eptest::EpMesh mesh(W, 1);
  const int E = 2 * W, d = 5, k = 2;
  auto routing = [&](int i, int64_t T) {
    std::vector<int> expert(T * k);
    for (int64_t t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) expert[t * k + j] = int((t + j + i + rank) % E);
    return expert;
  };
  auto run = [&](TokenDispatcher& disp, int i, std::unique_ptr<ForwardRows>& rows,
                 DispatchPlan& plan, std::vector<float>& x) {
    const int64_t T = 6 + 10 * i;
    const auto expert = routing(i, T);
    x = randn(T * d, "limit_x", 1.0f, (uint64_t(rank) << 20) + uint64_t(i));
    plan = disp.plan(expert, T, k);
    rows = disp.dispatch_forward(plan, host_rows(x, d));
    Tensor out = rows->out();
    for (int64_t r = 0; r < plan.received() * d; ++r) out[r] = 2.0f * rows->in()[r];
    std::vector<float> w(T * k, 0.5f), y(T * d);
    disp.combine_forward(plan, *rows, host_flat(w), host_rows(y, d));
    int64_t bad = 0;
    for (int64_t e = 0; e < T * d; ++e) bad += y[e] != 2.0f * x[e];
    return bad;
  };
  // The blocks of the first forward, measured without a limit.
  TokenDispatcher free_disp(mesh.ep_comm.get(), E, EpTransportChoice::shm);
  std::unique_ptr<ForwardRows> r0, r1;
  DispatchPlan p0, p1;
  std::vector<float> x0, x1;
  CHECK(run(free_disp, 0, r0, p0, x0) == 0);
  const double first = free_disp.shm_bytes();
  REQUIRE(first > 0);
  r0.reset();

  // A limit that holds exactly those: the first forward keeps shm, the
  // second (more tokens, while the first is alive) does not fit.
  TokenDispatcher disp(mesh.ep_comm.get(), E, EpTransportChoice::shm, first);
  CHECK(run(disp, 0, r0, p0, x0) == 0);
  CHECK(disp.transport() == EpTransport::shm);
  CHECK(run(disp, 1, r1, p1, x1) == 0);
  CHECK(disp.transport() == EpTransport::alltoallv);
  CHECK(disp.transport_reason().find("ep_shm_limit_mb") != std::string::npos);
  CHECK(disp.shm_bytes() == first);
  // Both forwards' rows still read back for the backward, whichever way they went.
  for (auto* f : {&r0, &r1}) {
    const DispatchPlan& p = f == &r0 ? p0 : p1;
    const std::vector<float>& x = f == &r0 ? x0 : x1;
    int64_t bad = 0;
    const kernels::RowBlocks& rows = (*f)->returned();
    for (int64_t t = 0; t < p.T; ++t)
      for (int j = 0; j < k; ++j)
        for (int c = 0; c < d; ++c)
          bad += block_row(rows, p.row_of.data<int64_t>()[t * k + j], d)[c] != 2.0f * x[t * d + c];
    CHECK(bad == 0);
  }
}

TEST_CASE("capacity drops with ep equal the one-rank drops of each rank's tokens", "[ep]") {
  const int W = testing::world_size(), rank = testing::world_rank();
  for (int ep : {1, 2, 4, 8}) {
    if (W % ep) continue;
    eptest::EpMesh mesh(ep, 1);
    const ModelConfig cfg =
        testing::moe_layer_config({.d_model = 8, .ffn = 12, .aux_loss = 0.02, .capacity = 0.75});
    const int d = cfg.d_model, T = 20;
    std::vector<int> sample(T, 0);
    // Reference: the all-local layer on each rank's tokens in turn; expert
    // gradients add up over the slices as they do over ranks.
    MoELayer ref(cfg, 1, nullptr, nullptr);
    std::vector<float> y_ref, dx_ref;
    int64_t dropped_ref = 0;
    for (int r = 0; r < W; ++r) {
      auto x = randn(T * d, "cap_x", 1.0f, uint64_t(r) << 20);
      auto dy = randn(T * d, "cap_dy", 1.0f, uint64_t(r) << 20);
      std::vector<float> y(T * d), dx(T * d);
      MoELayer::Cache c;
      MoEStats st;
      ref.forward(host_rows(x, d), sample, 1, host_rows(y, d), c, st);
      ref.backward(host_rows(dy, d), host_rows(dx, d), c, 1.0f);
      dropped_ref += st.dropped;
      if (r == rank) y_ref = y, dx_ref = dx;
    }
    MoELayer layer(cfg, 1, mesh.ep_comm.get(), nullptr);
    auto x = randn(T * d, "cap_x", 1.0f, uint64_t(rank) << 20);
    auto dy = randn(T * d, "cap_dy", 1.0f, uint64_t(rank) << 20);
    std::vector<float> y(T * d), dx(T * d);
    MoELayer::Cache c;
    MoEStats st;
    layer.forward(host_rows(x, d), sample, 1, host_rows(y, d), c, st);
    layer.backward(host_rows(dy, d), host_rows(dx, d), c, 1.0f);
    INFO("ep " << ep << " rank " << rank);
    CHECK(c.routing.capacity == 4);  // ceil(0.75 * 20 * 2 / 8)
    for (auto v : st.tokens_per_expert) CHECK(v <= 4);
    int64_t dropped = st.dropped;
    mesh.world->allreduce_sum(&dropped, 1);
    CHECK(dropped == dropped_ref);
    CHECK(dropped > 0);
    CHECK(rel_l2_diff(y.data(), y_ref.data(), T * d) < 1e-5);
    CHECK(rel_l2_diff(dx.data(), dx_ref.data(), T * d) < 1e-5);
    for (int e = 0; e < layer.local_experts(); ++e)
      for (int w = 0; w < 3; ++w) {
        Param& p = layer.expert_param(e, w);
        mesh.replicas->allreduce_sum(p.grad.ptr(), p.grad.numel());
        // Every rank adds the same slices in another order: fp32 sums agree to rounding.
        CHECK(rel_l2_diff(p.grad.ptr(),
                          ref.expert_param(layer.first_local_expert() + e, w).grad.ptr(),
                          p.grad.numel()) < 1e-5);
      }
  }
}
