// Gradient parity of the pipeline executor: a stack of tanh MLP layers split
// into pp * vpp virtual stages, run under every schedule, gives the loss and
// the weight gradients of the whole stack computed on one rank. ZB-H1, ZB-V and
// DualPipeV run a real B/W split (B: input gradient only; W: weight gradients
// later); ZB-V and DualPipeV place stages r and 2p-1-r on rank r.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "kernel_ctx.hpp"
#include "mpi_test_util.hpp"
#include "trident/comm/comm.hpp"
#include "trident/core/rng.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/parallel/pp/executor.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/parallel/pp/simulator.hpp"
#include "trident/parallel/pp/torch_csv.hpp"

using namespace trident;
using namespace trident::pp;

namespace {

constexpr int kBatch = 4;           // rows per micro-batch
constexpr int kDim = 16;            // features
constexpr int kLayersPerStage = 2;  // layers of one virtual stage

struct Layer {
  std::vector<float> w, b, dw, db;  // w: [kDim, kDim] (x @ w), b: [kDim]
};

// Layer l's weights from the counter-based RNG: the same on every rank.
Layer make_layer(int l) {
  Layer L;
  L.w.resize(kDim * kDim);
  L.b.resize(kDim);
  rng::fill_normal(L.w.data(), kDim * kDim, rng::hash_name("pp.w." + std::to_string(l)), 0,
                   1.0f / std::sqrt(float(kDim)));
  rng::fill_normal(L.b.data(), kDim, rng::hash_name("pp.b." + std::to_string(l)), 0, 0.1f);
  L.dw.assign(kDim * kDim, 0.0f);
  L.db.assign(kDim, 0.0f);
  return L;
}

std::vector<float> batch_input(int mb) {
  std::vector<float> x(kBatch * kDim);
  rng::fill_normal(x.data(), kBatch * kDim, rng::hash_name("pp.x"), uint64_t(mb) * kBatch * kDim,
                   1.0f);
  return x;
}
std::vector<float> batch_target(int mb) {
  std::vector<float> t(kBatch * kDim);
  rng::fill_normal(t.data(), kBatch * kDim, rng::hash_name("pp.t"), uint64_t(mb) * kBatch * kDim,
                   0.5f);
  return t;
}

// y = tanh(x w + b); saves x and y for the backward.
void layer_forward(const Layer& L, const std::vector<float>& x, std::vector<float>& y) {
  y.assign(kBatch * kDim, 0.0f);
  for (int i = 0; i < kBatch; ++i)
    for (int j = 0; j < kDim; ++j) y[i * kDim + j] = L.b[j];
  kernels::sgemm(test::kernel_ctx(), false, false, kBatch, kDim, kDim, 1.0f, x.data(), kDim,
                 L.w.data(), kDim, 1.0f, y.data(), kDim);
  for (auto& v : y) v = std::tanh(v);
}

// From dL/dy: dL/dpre (returned in dpre) and dL/dx.
void layer_backward_input(const Layer& L, const std::vector<float>& y, const std::vector<float>& dy,
                          std::vector<float>& dpre, std::vector<float>& dx) {
  dpre.resize(kBatch * kDim);
  for (int i = 0; i < kBatch * kDim; ++i) dpre[i] = dy[i] * (1.0f - y[i] * y[i]);
  dx.assign(kBatch * kDim, 0.0f);
  kernels::sgemm(test::kernel_ctx(), false, true, kBatch, kDim, kDim, 1.0f, dpre.data(), kDim,
                 L.w.data(), kDim, 0.0f, dx.data(), kDim);
}

void layer_backward_weight(Layer& L, const std::vector<float>& x, const std::vector<float>& dpre) {
  kernels::sgemm(test::kernel_ctx(), true, false, kDim, kDim, kBatch, 1.0f, x.data(), kDim,
                 dpre.data(), kDim, 1.0f, L.dw.data(), kDim);
  for (int i = 0; i < kBatch; ++i)
    for (int j = 0; j < kDim; ++j) L.db[j] += dpre[i * kDim + j];
}

// Loss of one micro-batch: sum((y - t)^2) / (2 M); its gradient (y - t) / M.
double loss_and_grad(const std::vector<float>& y, int mb, int M, std::vector<float>& dy) {
  const auto t = batch_target(mb);
  dy.resize(y.size());
  double loss = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const float d = y[i] - t[i];
    loss += 0.5 * double(d) * d / M;
    dy[i] = d / float(M);
  }
  return loss;
}

// The whole stack on one rank, micro-batches in order: the reference.
struct Serial {
  std::vector<Layer> layers;
  double loss = 0;
  Serial(int n_layers, int M) {
    for (int l = 0; l < n_layers; ++l) layers.push_back(make_layer(l));
    for (int mb = 0; mb < M; ++mb) {
      std::vector<std::vector<float>> xs(n_layers + 1);
      xs[0] = batch_input(mb);
      for (int l = 0; l < n_layers; ++l) layer_forward(layers[l], xs[l], xs[l + 1]);
      std::vector<float> g, dpre, dx;
      loss += loss_and_grad(xs[n_layers], mb, M, g);
      for (int l = n_layers - 1; l >= 0; --l) {
        layer_backward_input(layers[l], xs[l + 1], g, dpre, dx);
        layer_backward_weight(layers[l], xs[l], dpre);
        g = dx;
      }
    }
  }
};

// One rank's virtual stages of the same stack.
class MlpStack : public PipelineStage {
 public:
  MlpStack(const Schedule& s, int rank) : s_(s), rank_(rank) {
    for (int c = 0; c < s.vpp; ++c) {
      const int st = s.stage_of(rank, c);
      for (int k = 0; k < kLayersPerStage; ++k)
        layers_[st].push_back(make_layer(st * kLayersPerStage + k));
    }
  }
  int64_t boundary_numel(int, int) override { return kBatch * kDim; }

  void forward(int chunk, int mb, const Tensor& input_t, Tensor& output_t) override {
    const float* input = input_t.empty() ? nullptr : input_t.ptr();
    float* output = output_t.empty() ? nullptr : output_t.ptr();
    const int st = s_.stage_of(rank_, chunk);
    Saved& sv = saved_[{st, mb}];
    REQUIRE(sv.xs.empty());  // each (stage, micro-batch) forward runs once
    sv.xs.resize(kLayersPerStage + 1);
    if (st == 0) {
      REQUIRE(input == nullptr);
      sv.xs[0] = batch_input(mb);
    } else {
      REQUIRE(input != nullptr);
      sv.xs[0].assign(input, input + kBatch * kDim);
    }
    for (int k = 0; k < kLayersPerStage; ++k) layer_forward(layers_[st][k], sv.xs[k], sv.xs[k + 1]);
    const bool is_last = st == s_.num_stages() - 1;
    REQUIRE((output == nullptr) == is_last);
    if (output) std::copy(sv.xs.back().begin(), sv.xs.back().end(), output);
  }

  void backward(int chunk, int mb, const Tensor& grad_output_t, Tensor& grad_input_t,
                bool weight_grad) override {
    const float* grad_output = grad_output_t.empty() ? nullptr : grad_output_t.ptr();
    float* grad_input = grad_input_t.empty() ? nullptr : grad_input_t.ptr();
    const int st = s_.stage_of(rank_, chunk);
    REQUIRE(weight_grad == !s_.split_backward);
    Saved& sv = saved_.at({st, mb});
    REQUIRE(sv.dpre.empty());
    std::vector<float> g, dx;
    if (st == s_.num_stages() - 1) {
      REQUIRE(grad_output == nullptr);
      loss += loss_and_grad(sv.xs.back(), mb, s_.microbatches, g);
    } else {
      REQUIRE(grad_output != nullptr);
      g.assign(grad_output, grad_output + kBatch * kDim);
    }
    sv.dpre.resize(kLayersPerStage);
    for (int k = kLayersPerStage - 1; k >= 0; --k) {
      layer_backward_input(layers_[st][k], sv.xs[k + 1], g, sv.dpre[k], dx);
      g = dx;
    }
    REQUIRE((grad_input == nullptr) == (st == 0));
    if (grad_input) std::copy(g.begin(), g.end(), grad_input);
    if (weight_grad) backward_weight(chunk, mb);
  }

  void backward_weight(int chunk, int mb) override {
    const int st = s_.stage_of(rank_, chunk);
    Saved& sv = saved_.at({st, mb});
    REQUIRE(sv.dpre.size() == size_t(kLayersPerStage));  // B ran first
    for (int k = 0; k < kLayersPerStage; ++k)
      layer_backward_weight(layers_[st][k], sv.xs[k], sv.dpre[k]);
    saved_.erase({st, mb});
    ++weight_passes;
  }

  std::map<int, std::vector<Layer>> layers_;  // by virtual stage
  double loss = 0;
  int weight_passes = 0;

 private:
  struct Saved {
    std::vector<std::vector<float>> xs;    // layer inputs, then the stage output
    std::vector<std::vector<float>> dpre;  // per layer, between B and W
  };
  const Schedule& s_;
  int rank_;
  std::map<std::pair<int, int>, Saved> saved_;
};

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_l2_diff(a.data(), b.data(), int64_t(a.size()));
}

double norm(const std::vector<float>& a) {
  double s = 0;
  for (float v : a) s += double(v) * v;
  return std::sqrt(s);
}

struct Case {
  std::string name;
  int m, v;
};

}  // namespace

TEST_CASE("every schedule gives the one-rank loss and gradients", "[pp][mpi]") {
  MpiCommunicator pp(MPI_COMM_WORLD, CommKind::pp, "pp", 60.0, false);
  const int p = pp.size(), me = pp.rank();
  std::vector<Case> cases;
  for (const std::string name : {"afab", "1f1b", "zb-h1"})
    for (int m : {3, p, 2 * p + 1}) cases.push_back({name, m, 1});
  for (int m : {3, p, 2 * p + 1}) cases.push_back({"interleaved", m, 2});
  cases.push_back({"interleaved", 2 * p, 3});
  // The V placement: rank r holds stages r and 2p-1-r.
  for (int m : {1, 3, p, 2 * p + 1}) cases.push_back({"zb-v", m, 2});
  for (int m : {2 * p, 2 * p + 3}) cases.push_back({"dualpipev", m, 2});

  for (const Case& c : cases) {
    INFO("rank " << me << " " << c.name << " p=" << p << " m=" << c.m << " v=" << c.v);
    const Schedule s = lower(make_schedule(c.name, p, c.m, c.v));
    const int n_layers = s.num_stages() * kLayersPerStage;
    const Serial ref(n_layers, c.m);

    MlpStack stack(s, me);
    std::vector<TimelineEvent> timeline;
    const ExecResult res = execute(s, me, stack, pp, 7, &timeline);

    // Loss: computed by the rank holding the last virtual stage.
    double loss = stack.loss;
    pp.allreduce_sum(&loss, 1);
    CHECK(std::abs(loss - ref.loss) <= 1e-5 * std::abs(ref.loss));
    CHECK(ref.loss > 0);

    // Weight gradients of every layer this rank holds, accumulated over all micro-batches.
    CHECK(stack.weight_passes == c.m * c.v);
    for (const auto& [st, layers] : stack.layers_) {
      for (int k = 0; k < kLayersPerStage; ++k) {
        const Layer& got = layers[k];
        const Layer& want = ref.layers[st * kLayersPerStage + k];
        INFO("stage " << st << " layer " << k);
        REQUIRE(norm(want.dw) > 0);
        CHECK(rel_diff(got.dw, want.dw) <= 1e-5);
        CHECK(rel_diff(got.db, want.db) <= 1e-5);
      }
    }

    // Executor bookkeeping matches the schedule and the simulator's memory count.
    CHECK(res.peak_inflight == peak_inflight(s)[me]);
    REQUIRE(timeline.size() == s.ranks[me].size());
    for (size_t i = 0; i < timeline.size(); ++i) {
      CHECK(timeline[i].kind == op_name(s.ranks[me][i].op));
      CHECK(timeline[i].microbatch == s.ranks[me][i].microbatch);
      CHECK(timeline[i].step == 7);
      CHECK(timeline[i].t_end_s >= timeline[i].t_begin_s);
      if (i) CHECK(timeline[i].t_begin_s >= timeline[i - 1].t_end_s);
    }
    CHECK(res.makespan_s >= res.busy_s);
    CHECK(res.bubble_fraction >= 0);
    CHECK(res.bubble_fraction < 1);
    const int64_t boundaries_sent =
        int64_t(std::count_if(s.ranks[me].begin(), s.ranks[me].end(), [](const Action& a) {
          return a.op == Op::SEND_F || a.op == Op::SEND_B;
        }));
    CHECK(res.bytes_sent == boundaries_sent * kBatch * kDim * int64_t(sizeof(float)));
  }
}

TEST_CASE("PyTorch's compute+comms files run with the one-rank result", "[pp][mpi][np2]") {
  MpiCommunicator pp(MPI_COMM_WORLD, CommKind::pp, "pp", 60.0, false);
  REQUIRE(pp.size() == 2);
  const char* src = std::getenv("TRIDENT_SOURCE_DIR");
  REQUIRE(src != nullptr);
  bool any_early = false;
  for (const char* file : {"torch_p2m4_zbv_comms.csv", "torch_p2m4_dualpipev_comms.csv",
                           "torch_p2m4_interleaved_comms.csv", "early_recv.csv"}) {
    INFO("rank " << pp.rank() << " " << file);
    std::ifstream f(std::string(src) + "/tests/unit/pp/data/torch/" + file);
    REQUIRE(f.good());
    std::stringstream text;
    text << f.rdbuf();
    const Schedule s = from_torch_csv(text.str(), file).schedule;
    validate(s);
    for (const auto& row : s.early_posts) any_early |= !row.empty();
    const Serial ref(s.num_stages() * kLayersPerStage, s.microbatches);
    MlpStack stack(s, pp.rank());
    execute(s, pp.rank(), stack, pp, 0, nullptr);
    double loss = stack.loss;
    pp.allreduce_sum(&loss, 1);
    CHECK(std::abs(loss - ref.loss) <= 1e-5 * std::abs(ref.loss));
    CHECK(stack.weight_passes == s.microbatches * s.vpp);
    for (const auto& [st, layers] : stack.layers_)
      for (int k = 0; k < kLayersPerStage; ++k) {
        CHECK(rel_diff(layers[k].dw, ref.layers[st * kLayersPerStage + k].dw) <= 1e-5);
        CHECK(rel_diff(layers[k].db, ref.layers[st * kLayersPerStage + k].db) <= 1e-5);
      }
  }
  CHECK(any_early);  // the files do post receives early
}

TEST_CASE("pp bytes are accounted on the pp counters", "[pp][mpi]") {
  MpiCommunicator pp(MPI_COMM_WORLD, CommKind::pp, "pp", 60.0, false);
  const Schedule s = lower(make_schedule("1f1b", pp.size(), 4));
  MlpStack stack(s, pp.rank());
  const CommCounters before = pp.counters();
  const ExecResult res = execute(s, pp.rank(), stack, pp, 0, nullptr);
  const CommCounters diff = pp.counters() - before;
  // The executor's own sends plus the final makespan allreduce (2 doubles).
  CHECK(diff.bytes_sent[int(CommKind::pp)] >= double(res.bytes_sent));
  CHECK(diff.bytes_sent[int(CommKind::pp)] <= double(res.bytes_sent) + 2 * sizeof(double));
  CHECK(res.bytes_sent > 0);
}
