// ParamStore: the stage's parameters laid out in one value and one gradient
// buffer, grouped by reduction kind, each Param rebound to views of them.
#include <catch2/catch.hpp>
#include <cstring>
#include <map>

#include "counting_allocator.hpp"
#include "trident/core/error.hpp"
#include "trident/core/param_store.hpp"

using namespace trident;
using trident::testing::CountingAllocator;

namespace {

void host_copy(Tensor& dst, const Tensor& src) {
  REQUIRE(dst.numel() == src.numel());
  std::memcpy(dst.data_ptr(), src.data_ptr(), src.bytes());
}
void host_fill(Tensor& dst, float v) { dst.fill(v); }

}  // namespace

TEST_CASE("ParamStore: dense, expert, none ranges in stable order; values kept; views rebound") {
  CountingAllocator a;
  // Interleaved kinds, as a stage lists them (router, experts, attention, ...).
  std::vector<Param> ps;
  ps.emplace_back("a.dense", std::vector<int64_t>{3, 5}, GradReduce::dense);
  ps.emplace_back("b.expert", std::vector<int64_t>{7}, GradReduce::expert);
  ps.emplace_back("c.none", std::vector<int64_t>{2, 2}, GradReduce::none);
  ps.emplace_back("d.dense", std::vector<int64_t>{11}, GradReduce::dense);
  ps.emplace_back("e.expert", std::vector<int64_t>{2, 3}, GradReduce::expert);
  std::map<std::string, std::vector<float>> init;
  std::vector<Param*> list;
  for (Param& p : ps) {
    p.init_normal(0.5f);
    p.grad.fill(3.0f);  // must not survive: a fresh store's gradients are zero
    init[p.name] = std::vector<float>(p.value.values().begin(), p.value.values().end());
    list.push_back(&p);
  }
  const size_t host_before = cpu_allocator().bytes_in_use();
  ParamStore store(list, a, host_copy, host_fill);
  const size_t host_after = cpu_allocator().bytes_in_use();

  const std::vector<std::string> order{"a.dense", "d.dense", "b.expert", "e.expert", "c.none"};
  REQUIRE(store.entries().size() == order.size());
  int64_t off = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const ParamStore::Entry& e = store.entries()[i];
    INFO(e.param->name);
    REQUIRE(e.param->name == order[i]);
    REQUIRE(e.offset == off);
    off += e.numel;
    // rebound to views of the buffers, shape kept, value copied exactly
    REQUIRE(e.param->value.shares_storage_with(store.values()));
    REQUIRE(e.param->grad.shares_storage_with(store.grads()));
    REQUIRE(e.param->value.data_ptr() == store.values().ptr() + e.offset);
    REQUIRE(e.param->grad.data_ptr() == store.grads().ptr() + e.offset);
    const auto& want = init[e.param->name];
    REQUIRE(e.param->value.numel() == int64_t(want.size()));
    REQUIRE(std::memcmp(e.param->value.ptr(), want.data(), want.size() * sizeof(float)) == 0);
    for (float g : e.param->grad.values()) REQUIRE(g == 0.0f);
  }
  REQUIRE(store.numel() == 15 + 11 + 7 + 6 + 4);
  REQUIRE(store.range(GradReduce::dense).begin == 0);
  REQUIRE(store.range(GradReduce::dense).end == 26);
  REQUIRE(store.range(GradReduce::expert).begin == 26);
  REQUIRE(store.range(GradReduce::expert).end == 39);
  REQUIRE(store.range(GradReduce::none).begin == 39);
  REQUIRE(store.range(GradReduce::none).end == 43);
  REQUIRE(ps[0].value.shape() == std::vector<int64_t>{3, 5});

  // A write through the Param is a write into the kind's range.
  ps[4].grad[1] = 42.0f;  // e.expert, element 1
  REQUIRE(store.grads(GradReduce::expert)[7 + 1] == 42.0f);
  ps[3].value[0] = -1.0f;  // d.dense, element 0
  REQUIRE(store.values(GradReduce::dense)[15] == -1.0f);

  // Only the two buffers remain: the parameters' own (host) tensors were released.
  REQUIRE(a.bytes_in_use() == size_t(2 * 43 * sizeof(float)));
  REQUIRE(host_before - host_after == size_t(2 * 43 * sizeof(float)));
  REQUIRE(store.grads(GradReduce::none).numel() == 4);
}

TEST_CASE("ParamStore: a kind with no parameters has an empty range; a repeat is refused") {
  CountingAllocator a;
  Param p("only", {4}, GradReduce::dense);
  p.init_constant(2.0f);
  ParamStore store({&p}, a, host_copy, host_fill);
  REQUIRE(store.grads(GradReduce::expert).empty());
  REQUIRE(store.range(GradReduce::expert).size() == 0);
  REQUIRE(store.values(GradReduce::dense)[3] == 2.0f);

  Param q("twice", {2});
  REQUIRE_THROWS_AS(ParamStore({&q, &q}, a, host_copy, host_fill), Error);
}

TEST_CASE("ParamStore: ranges padded to a multiple for equal shards; the padding is zero") {
  CountingAllocator a;
  Param d1("d1", {5}, GradReduce::dense), e1("e1", {2, 2}, GradReduce::expert),
      d2("d2", {2}, GradReduce::dense);
  for (Param* p : {&d1, &e1, &d2}) p->init_normal(1.0f);
  ParamStore store({&d1, &e1, &d2}, a, host_copy, host_fill, {4, 3, 1});
  // dense: 5 + 2 = 7 -> 8; expert: 4 -> 6; none: empty
  REQUIRE(store.range(GradReduce::dense).begin == 0);
  REQUIRE(store.range(GradReduce::dense).end == 8);
  REQUIRE(store.range(GradReduce::expert).begin == 8);
  REQUIRE(store.range(GradReduce::expert).end == 14);
  REQUIRE(store.range(GradReduce::none).size() == 0);
  REQUIRE(store.numel() == 14);
  REQUIRE(store.entry(&d2).offset == 5);
  REQUIRE(store.entry(&e1).offset == 8);
  for (int64_t i : {7, 12, 13}) {
    INFO("padding element " << i);
    REQUIRE(store.values()[i] == 0.0f);
    REQUIRE(store.grads()[i] == 0.0f);
  }
  Param other("other", {1});
  REQUIRE_THROWS_AS(store.entry(&other), Error);
  REQUIRE_THROWS_AS(ParamStore({&other}, a, host_copy, host_fill, {0, 1, 1}), Error);
}
