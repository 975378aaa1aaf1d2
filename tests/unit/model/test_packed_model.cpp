// Packed documents through the model on one process: a sequence holding
// several documents (Sample::doc_ids, RoPE positions restarting per
// document) gives the same token losses and the same parameter gradients as
// the documents run one by one as their own sequences; with model.window too;
// and the emulated device gives the host's bits.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

#include "tiny_config.hpp"
#include "trident/core/param_store.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/model/transformer.hpp"

using namespace trident;
using namespace trident::model;

namespace {

Config tiny(int64_t seq, int window) {
  // dense: the MoE aux loss is per sequence, not per document
  Config c = testing::tiny_config(
      {.vocab = 20, .d_model = 16, .ffn = 24, .experts = 0},
      {.task = DataTask::copy, .seq_len = int(seq), .micro_batch = 1, .microbatches = 1});
  c.model.init_std = 0.3;
  c.model.window = window;
  return c;
}

// Random documents (tokens and next-token targets inside each document; the
// last token of a document has no target), packed in one sample or served
// one at a time.
struct Documents {
  std::vector<std::vector<int32_t>> tokens;
};

Documents make_documents(const std::vector<int64_t>& lengths) {
  Documents d;
  for (size_t i = 0; i < lengths.size(); ++i) {
    std::vector<float> u(size_t(lengths[i]));
    rng::fill_normal(u.data(), lengths[i], rng::hash_name("doc tokens"), uint64_t(i) * 1000, 1.0f);
    std::vector<int32_t> t;
    for (float x : u) t.push_back(int32_t(std::fabs(x) * 7) % 20);
    d.tokens.push_back(t);
  }
  return d;
}

class PackedSource : public DataSource {
 public:
  PackedSource(const Documents& d, int piece) : d_(d), piece_(piece) {}
  Sample sample(int64_t, int64_t) const override {
    Sample s;
    for (size_t i = 0; i < d_.tokens.size(); ++i) {
      if (piece_ >= 0 && int(i) != piece_) continue;
      const auto& t = d_.tokens[i];
      for (size_t j = 0; j < t.size(); ++j) {
        s.tokens.push_back(t[j]);
        s.targets.push_back(j + 1 < t.size() ? t[j + 1] : -1);
        if (piece_ < 0) {
          s.doc_ids.push_back(int32_t(i));
          s.positions.push_back(int32_t(j));
        }
      }
    }
    return s;
  }
  int64_t targets_per_sample() const override { return 0; }

 private:
  const Documents& d_;
  int piece_;  // -1: all documents packed
};

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

// One forward and backward of the sample (loss scale 1: summed token losses).
Result run(const Config& c, const DataSource& src, const kernels::Ctx& ctx = {}) {
  ModelStage st(c, 0, 1, {}, {}, ctx);
  // The parameters in one buffer on ctx's device, as train::run keeps them.
  ParamStore store(
      st.params(), kernels::allocator_of(ctx),
      [&ctx](Tensor& dst, const Tensor& src) { kernels::copy(ctx, dst, src); },
      [&ctx](Tensor& dst, float value) { kernels::fill(ctx, dst.ptr(), dst.numel(), value); });
  std::vector<int64_t> pos(size_t(c.data.seq_len));
  std::iota(pos.begin(), pos.end(), 0);
  st.begin_step(make_microbatches(src, c.data, 0, 0, pos), 1.0f, 0.0f, nullptr);
  Tensor none, none2;
  st.forward(0, 0, none, none2);
  st.backward(0, 0, none2, none, true);
  Result r;
  r.loss = st.loss_sum();
  for (Param* p : st.params()) {
    const Tensor h = kernels::to_host(ctx, p->grad);
    r.grads[p->name].assign(h.ptr(), h.ptr() + h.numel());
  }
  return r;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * (a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void check_packed_equals_pieces(const std::vector<int64_t>& lengths, int window) {
  const Documents docs = make_documents(lengths);
  const int64_t seq = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
  const Result packed = run(tiny(seq, window), PackedSource(docs, -1));
  Result sum;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const Result one = run(tiny(lengths[i], window), PackedSource(docs, int(i)));
    sum.loss += one.loss;
    for (auto& [name, g] : one.grads) {
      auto& acc = sum.grads[name];
      acc.resize(g.size(), 0.0f);
      for (size_t e = 0; e < g.size(); ++e) acc[e] += g[e];
    }
  }
  CHECK(std::fabs(packed.loss - sum.loss) <= 1e-5 * std::fabs(sum.loss));
  REQUIRE(packed.grads.size() == sum.grads.size());
  for (auto& [name, g] : packed.grads) {
    INFO(name);
    CHECK(rel(g, sum.grads.at(name)) <= 1e-4);
  }
}

}  // namespace

TEST_CASE("a packed sequence trains like its documents one by one", "[model][documents]") {
  // A length-1 document, short ones, one longer than the rest together.
  check_packed_equals_pieces({5, 1, 17, 3, 40}, 0);
  SECTION("with a sliding window") { check_packed_equals_pieces({5, 1, 17, 3, 40}, 4); }
}

TEST_CASE("packed documents on the emulated device equal the host bit for bit",
          "[model][documents][emulated]") {
  static kernels::DeviceContext device(Device::emulated());
  const Documents docs = make_documents({9, 1, 30});
  const Config c = tiny(40, 6);
  const Result host = run(c, PackedSource(docs, -1));
  const Result emu = run(c, PackedSource(docs, -1), device.ctx());
  CHECK(host.loss == emu.loss);
  for (auto& [name, g] : host.grads) {
    INFO(name);
    CHECK(std::memcmp(g.data(), emu.grads.at(name).data(), g.size() * sizeof(float)) == 0);
  }
}
