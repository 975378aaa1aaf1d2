// DualPipeV's overlapped F+B slot run as two lanes (pp::ExecOptions::
// overlap_pairs, core/overlap.hpp) against the same slot run serially: a
// pipeline of two MoE chunks (pp = 1, the V placement: both stages on this
// rank) over an ep group of every rank, under dualpipev. The loss and every
// gradient are equal bit for bit, on both transports; and in the
// overlapped run the exchanges of one micro-batch were in flight while the
// other computed: the executor counts exchanges during which the other lane
// ran, and the slot's F and B spans intersect in time (serially they do
// not).
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "../../unit/ep/ep_test_util.hpp"
#include "ep_fixtures.hpp"
#include "ep_mesh.hpp"
#include "trident/core/overlap.hpp"
#include "trident/parallel/ep/moe_layer.hpp"
#include "trident/parallel/pp/executor.hpp"
#include "trident/parallel/pp/generators.hpp"

using namespace trident;

namespace {

constexpr int kTokens = 12;

// Chunk c is the MoE layer c; chunk 0 reads micro-batch mb's tokens, chunk
// 1's output y gives the loss sum(y^2)/2 (its gradient: y).
class MoeStage final : public pp::PipelineStage {
 public:
  MoeStage(const ModelConfig& cfg, Communicator* ep, EpTransportChoice transport)
      : d_(cfg.d_model) {
    for (int c = 0; c < 2; ++c)
      layers_.push_back(std::make_unique<ep::MoELayer>(cfg, c, ep, nullptr, transport));
  }
  int64_t boundary_numel(int, int) override { return int64_t(kTokens) * d_; }
  void forward(int chunk, int mb, const Tensor& input, Tensor& output) override {
    Kept& k = kept_[{chunk, mb}];
    if (chunk == 0) {
      k.x = testing::randn(int64_t(kTokens) * d_, "overlap_x" + std::to_string(mb), 1.0f,
                           uint64_t(testing::world_rank()) * 100000);
    } else {
      k.x.assign(input.ptr(), input.ptr() + input.numel());
    }
    k.y.assign(k.x.size(), 0.0f);
    ep::MoEStats stats;
    layers_[size_t(chunk)]->forward(testing::host_rows(k.x, d_), std::vector<int>(kTokens, 0), 1,
                                    testing::host_rows(k.y, d_), k.cache, stats);
    if (chunk == 0) {
      std::memcpy(output.ptr(), k.y.data(), sizeof(float) * k.y.size());
    } else {
      for (float v : k.y) loss += 0.5 * double(v) * double(v);
    }
  }
  void backward(int chunk, int mb, const Tensor& grad_output, Tensor& grad_input, bool) override {
    Kept& k = kept_.at({chunk, mb});
    const Tensor dy = chunk == 1 ? testing::host_rows(k.y, d_) : grad_output.reshape({kTokens, d_});
    std::vector<float> dx(k.x.size());
    layers_[size_t(chunk)]->backward(dy, testing::host_rows(dx, d_), k.cache, 0.0f);
    if (chunk == 1) std::memcpy(grad_input.ptr(), dx.data(), sizeof(float) * dx.size());
    kept_.erase({chunk, mb});
  }
  void backward_weight(int, int) override {}  // B accumulated them

  std::vector<Param*> params() {
    std::vector<Param*> all;
    for (auto& l : layers_)
      for (Param* p : l->params()) all.push_back(p);
    return all;
  }
  double loss = 0;

 private:
  struct Kept {
    std::vector<float> x, y;
    ep::MoELayer::Cache cache;
  };
  int d_;
  std::vector<std::unique_ptr<ep::MoELayer>> layers_;
  std::map<std::pair<int, int>, Kept> kept_;
};

struct Run {
  double loss = 0;
  std::vector<std::vector<float>> grads;
  pp::ExecResult result;
};

Run run(const pp::Schedule& lowered, Communicator& ep, EpTransportChoice transport, bool overlap) {
  const ModelConfig cfg = testing::moe_layer_config({.experts = 4, .init_std = 0.4});
  MoeStage stage(cfg, &ep, transport);
  pp::ExecOptions options;
  options.overlap_pairs = overlap;
  Run out;
  out.result = pp::execute(lowered, 0, stage, nullptr, 0, nullptr, options);
  out.loss = stage.loss;
  for (Param* p : stage.params())
    out.grads.emplace_back(p->grad.ptr(), p->grad.ptr() + p->grad.numel());
  return out;
}

// Slots whose F and B spans intersect in time.
int intersecting_slots(const pp::ExecResult& r) {
  int n = 0;
  for (size_t i = 0; i + 1 < r.actions.size(); ++i) {
    const pp::ActionTiming& f = r.actions[i];
    if (f.action.op != pp::Op::F || !f.action.overlapped) continue;
    const pp::ActionTiming& b = r.actions[i + 1];
    if (b.action.op == pp::Op::B && b.t_begin_s < f.t_end_s && f.t_begin_s < b.t_end_s) ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("overlapped F+B slots equal the serial slots bit for bit, exchanges in flight",
          "[ep][overlap][multirank]") {
  const int W = testing::world_size();
  REQUIRE(W >= 2);
  if (4 % W != 0) {
    WARN("SKIP: 4 experts need an ep group dividing 4; world " << W);
    return;
  }
  eptest::EpMesh mesh(W, 1);
  const pp::Schedule lowered = pp::lower(pp::make_schedule(PipelineSchedule::dualpipev, 1, 6, 2));
  for (auto transport : {EpTransportChoice::alltoallv, EpTransportChoice::automatic}) {
    INFO("transport " << (transport == EpTransportChoice::alltoallv ? "alltoallv" : "auto"));
    const Run serial = run(lowered, *mesh.ep_comm, transport, false);
    const Run pair = run(lowered, *mesh.ep_comm, transport, true);
    CHECK(serial.result.overlapped_pairs == 0);
    CHECK(serial.result.overlap_hidden == 0);
    CHECK(intersecting_slots(serial.result) == 0);
    REQUIRE(pair.result.overlapped_pairs > 0);
    // each MoE layer's F exchanges twice and its B twice: every slot posts 4
    CHECK(pair.result.overlap_exchanges == 4 * pair.result.overlapped_pairs);
    CHECK(pair.result.overlap_hidden >= 2 * pair.result.overlapped_pairs);
    CHECK(intersecting_slots(pair.result) == pair.result.overlapped_pairs);
    CHECK(pair.loss == serial.loss);
    REQUIRE(pair.grads.size() == serial.grads.size());
    for (size_t i = 0; i < pair.grads.size(); ++i) {
      INFO("parameter " << i);
      REQUIRE(pair.grads[i].size() == serial.grads[i].size());
      CHECK(std::memcmp(pair.grads[i].data(), serial.grads[i].data(),
                        sizeof(float) * pair.grads[i].size()) == 0);
    }
    double norm = 0;
    for (const auto& g : serial.grads)
      for (float v : g) norm += double(v) * v;
    CHECK(norm > 0);  // the gradients are not all zero
  }
}

TEST_CASE("outside a pair in_flight does nothing", "[ep][overlap]") {
  CHECK_FALSE(overlap::in_flight());
  CHECK(overlap::lane() == 0);
}
