// The MoE and router ops on tensors (kernels/functional.hpp, "MoE and
// router"): the same bits as their pointer forms on one routing (what keeps
// the ep layer bit-identical), the unpermute from blocks equal to one
// buffer, bf16 tensors staged through the f32 row, and one clear error for
// a tensor of the wrong dtype or size. Tensor::borrow, which the ep layer
// wraps its row buffers with, writes the caller's memory and frees nothing.
#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "ep_test_util.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/moe.hpp"
#include "trident/kernels/router.hpp"
#include "trident/kernels/tensor_ops.hpp"

using namespace trident;
using trident::testing::randn;

namespace {

const kernels::Ctx kCpu{};

Tensor host(const std::vector<float>& v, std::vector<int64_t> shape) {
  Tensor t(std::move(shape));
  std::memcpy(t.ptr(), v.data(), v.size() * sizeof(float));
  return t;
}

Tensor typed(std::vector<int64_t> shape, DType dtype) {
  return Tensor::empty(std::move(shape), cpu_allocator(), dtype);
}

bool same_bits(const Tensor& a, const void* b) {
  return std::memcmp(a.data_ptr(), b, a.bytes()) == 0;
}

// One routing of T tokens over E experts, k slots, with dropped copies:
// the tensors the router ops make, and the pointer forms' results beside.
struct Routed {
  static constexpr int64_t T = 11;
  static constexpr int E = 4, k = 2, n_samples = 2;
  kernels::RouterDims dims{T, E, k, kernels::RouterScore::softmax, true};
  Tensor logits = host(randn(T * E, "mf_logits", 2.0f), {T, E});
  Tensor probs = Tensor({T, E}), lse = Tensor({T}), weight = Tensor({T * k});
  Tensor chosen = typed({T * k}, DType::i32), sample = typed({T}, DType::i32);
  Tensor stats = typed({n_samples, E + 1}, DType::f64);
  Tensor f = typed({n_samples * E}, DType::f64), inv = typed({n_samples}, DType::f64);

  Routed() {
    for (int64_t t = 0; t < T; ++t) sample.data<int32_t>()[t] = t < 5 ? 0 : 1;
    kernels::router_scores(kCpu, dims, logits, probs, lse);
    kernels::router_topk(kCpu, dims, probs, Tensor(), chosen, weight);
    kernels::router_load(kCpu, dims, chosen, sample, stats);
    kernels::router_frequencies(kCpu, dims, stats, f, inv);
  }
  kernels::RouterTensors tensors() const {
    return {logits, probs, lse, chosen, weight, sample, f, inv, 0.01, 0.001};
  }
};

}  // namespace

TEST_CASE("router ops on tensors equal their pointer forms bit for bit", "[router]") {
  Routed r;
  const int64_t T = r.T, n = T * r.k;
  std::vector<float> probs(static_cast<size_t>(T * r.E)), lse(static_cast<size_t>(T)),
      weight(static_cast<size_t>(n));
  std::vector<int> chosen(static_cast<size_t>(n));
  kernels::router_scores(kCpu, r.dims, r.logits.ptr(), probs.data(), lse.data());
  CHECK(same_bits(r.probs, probs.data()));
  CHECK(same_bits(r.lse, lse.data()));
  kernels::router_topk(kCpu, r.dims, probs.data(), nullptr, chosen.data(), weight.data());
  CHECK(same_bits(r.chosen, chosen.data()));
  CHECK(same_bits(r.weight, weight.data()));
  std::vector<double> stats(static_cast<size_t>(r.n_samples * (r.E + 1))),
      f(static_cast<size_t>(r.n_samples * r.E)), inv(static_cast<size_t>(r.n_samples));
  kernels::router_load(kCpu, r.dims, chosen.data(), r.sample.data<int32_t>(), r.n_samples,
                       stats.data());
  CHECK(same_bits(r.stats, stats.data()));
  kernels::router_frequencies(kCpu, r.dims, stats.data(), r.n_samples, f.data(), inv.data());
  CHECK(same_bits(r.f, f.data()));
  CHECK(same_bits(r.inv, inv.data()));

  const kernels::RouterLossTerms terms{r.sample.data<int32_t>(), f.data(), inv.data(), 0.01, 0.001};
  double shares[2];
  kernels::router_losses(kCpu, r.dims, probs.data(), lse.data(), terms, shares, shares + 1);
  Tensor tshares = typed({2}, DType::f64);
  kernels::router_losses(kCpu, r.dims, r.tensors(), tshares);
  CHECK(same_bits(tshares, shares));

  const Tensor dweight = host(randn(n, "mf_dweight"), {n});
  std::vector<float> dlogits(static_cast<size_t>(T * r.E));
  const kernels::RouterSaved saved{r.logits.ptr(), probs.data(), lse.data(), chosen.data(),
                                   weight.data()};
  kernels::router_backward(kCpu, r.dims, saved, terms, dweight.ptr(), 0.7f, dlogits.data());
  Tensor tdlogits({T, r.E});
  kernels::router_backward(kCpu, r.dims, r.tensors(), dweight, 0.7f, tdlogits);
  CHECK(same_bits(tdlogits, dlogits.data()));

  // Capacity over a group of two ranks that route the same tokens twice.
  Tensor token = typed({2 * T}, DType::i64), weight2({2 * n}), chosen2 = typed({2 * n}, DType::i32);
  for (int64_t i = 0; i < 2 * T; ++i) token.data<int64_t>()[i] = i;
  for (int64_t i = 0; i < 2 * n; ++i) {
    weight2.ptr()[i] = weight[size_t(i % n)];
    chosen2.data<int32_t>()[i] = chosen[size_t(i % n)];
  }
  std::vector<int> expert(static_cast<size_t>(n));
  int64_t dropped = -1;
  kernels::router_capacity(kCpu, r.dims, 2, 1, token.data<int64_t>(), weight2.ptr(),
                           chosen2.data<int32_t>(), 3, expert.data(), &dropped);
  Tensor texpert = typed({n}, DType::i32), tdropped = typed({1}, DType::i64);
  kernels::router_capacity(kCpu, r.dims, 2, 1, token, weight2, chosen2, 3, texpert, tdropped);
  CHECK(same_bits(texpert, expert.data()));
  CHECK(tdropped.data<int64_t>()[0] == dropped);
  CHECK(dropped > 0);  // capacity 3 of 2 * 22 copies over 4 experts drops some
}

TEST_CASE("MoE row ops on tensors equal their pointer forms, blocks equal one buffer", "[moe]") {
  Routed r;
  const int64_t T = r.T, n = T * r.k, d = 5;
  // Drop every third copy.
  Tensor expert = typed({n}, DType::i32);
  for (int64_t i = 0; i < n; ++i)
    expert.data<int32_t>()[i] = i % 3 == 2 ? -1 : r.chosen.data<int32_t>()[i];
  Tensor counts = typed({r.E}, DType::i64);
  kernels::expert_counts(kCpu, expert, counts);
  std::vector<int64_t> pcounts(static_cast<size_t>(r.E));
  kernels::expert_counts(kCpu, expert.data<int32_t>(), n, r.E, pcounts.data());
  REQUIRE(same_bits(counts, pcounts.data()));
  int64_t S = 0;
  for (int64_t c : pcounts) S += c;
  Tensor row_of = typed({n}, DType::i64), send_token = typed({S}, DType::i64);
  kernels::expert_order(kCpu, expert, r.k, counts, row_of, send_token);
  std::vector<int64_t> prow(static_cast<size_t>(n)), psend(static_cast<size_t>(S));
  kernels::expert_order(kCpu, expert.data<int32_t>(), n, r.k, r.E, pcounts.data(), prow.data(),
                        psend.data());
  REQUIRE(same_bits(row_of, prow.data()));
  REQUIRE(same_bits(send_token, psend.data()));

  const Tensor x = host(randn(T * d, "mf_x"), {T, d});
  Tensor rows({S, d});
  kernels::gather_rows(kCpu, x, send_token, rows);
  std::vector<float> prows(static_cast<size_t>(S * d));
  kernels::gather_rows(kCpu, x.ptr(), d, psend.data(), S, prows.data());
  CHECK(same_bits(rows, prows.data()));

  Tensor y({T, d});
  kernels::combine_rows(kCpu, rows, row_of, r.weight, r.k, y);
  std::vector<float> py(static_cast<size_t>(T * d));
  kernels::combine_rows(kCpu, kernels::RowSource(prows.data()), d, prow.data(), r.weight.ptr(), T,
                        r.k, py.data());
  CHECK(same_bits(y, py.data()));

  // The same rows as one block per expert, each in a buffer of its own.
  std::vector<Tensor> blocks;
  std::vector<int64_t> first{0};
  for (int e = 0; e < r.E; ++e) {
    blocks.push_back(
        kernels::clone(kCpu, rows.rows(first.back(), first.back() + pcounts[size_t(e)])));
    first.push_back(first.back() + pcounts[size_t(e)]);
  }
  Tensor yb({T, d});
  kernels::combine_rows(kCpu, kernels::RowBlocks(blocks, first), row_of, r.weight, r.k, yb);
  CHECK(same_bits(yb, py.data()));

  const Tensor dy = host(randn(T * d, "mf_dy"), {T, d});
  Tensor drows({S, d}), dweight({n});
  kernels::combine_rows_backward(kCpu, kernels::RowBlocks(blocks, first), dy, row_of, r.weight, r.k,
                                 drows, dweight);
  std::vector<float> pdrows(static_cast<size_t>(S * d)), pdweight(static_cast<size_t>(n));
  kernels::combine_rows_backward(kCpu, kernels::RowSource(prows.data()), dy.ptr(), d, prow.data(),
                                 r.weight.ptr(), T, r.k, pdrows.data(), pdweight.data());
  CHECK(same_bits(drows, pdrows.data()));
  CHECK(same_bits(dweight, pdweight.data()));

  Tensor dx({T, d});
  kernels::scatter_add_rows(kCpu, drows, row_of, r.k, dx);
  std::vector<float> pdx(static_cast<size_t>(T * d));
  kernels::scatter_add_rows(kCpu, pdrows.data(), d, prow.data(), T, r.k, pdx.data());
  CHECK(same_bits(dx, pdx.data()));
}

TEST_CASE("MoE row ops stage bf16 rows through the f32 row", "[moe]") {
  const auto& ctx = kCpu;
  const int64_t T = 6, k = 2, d = 4, S = 9;
  Tensor row_of = typed({T * k}, DType::i64);
  for (int64_t i = 0; i < T * k; ++i) row_of.data<int64_t>()[i] = i % 4 == 3 ? -1 : (i * 5) % S;
  const Tensor rows32 = host(randn(S * d, "mf_b_rows"), {S, d});
  const Tensor w32 = host(randn(T * k, "mf_b_w"), {T * k});
  Tensor rows16 = typed({S, d}, DType::bf16), w16 = typed({T * k}, DType::bf16);
  kernels::convert(ctx, rows32, rows16);
  kernels::convert(ctx, w32, w16);
  // By hand: the f32 op on the widened inputs, its output rounded.
  Tensor rows_w({S, d}), w_w({T * k}), y32({T, d}), want = typed({T, d}, DType::bf16);
  kernels::convert(ctx, rows16, rows_w);
  kernels::convert(ctx, w16, w_w);
  kernels::combine_rows(ctx, rows_w, row_of, w_w, int(k), y32);
  kernels::convert(ctx, y32, want);
  Tensor y16 = typed({T, d}, DType::bf16);
  kernels::combine_rows(ctx, rows16, row_of, w16, int(k), y16);
  CHECK(std::memcmp(y16.data_ptr(), want.data_ptr(), want.bytes()) == 0);
}

TEST_CASE("MoE and router ops name the op and the tensor that is wrong", "[moe]") {
  Routed r;
  Tensor out({3, 2});
  const Tensor as_i32 = typed({3}, DType::i32);
  CHECK_THROWS_WITH(kernels::gather_rows(kCpu, Tensor({4, 2}), as_i32, out),
                    Catch::Contains("kernels::gather_rows: src_row") && Catch::Contains("i64"));
  Tensor small({r.T});
  CHECK_THROWS_WITH(kernels::router_scores(kCpu, r.dims, r.logits, small, r.lse),
                    Catch::Contains("kernels::router_scores: probs"));
  Tensor row_of = typed({7}, DType::i64);
  CHECK_THROWS_WITH(kernels::combine_rows(kCpu, Tensor({4, 2}), row_of, Tensor(), 2, out),
                    Catch::Contains("is not T * k"));
}

TEST_CASE("a borrowed tensor writes the caller's memory and frees nothing", "[moe]") {
  std::vector<float> mine(6, 1.0f);
  {
    const Tensor t = Tensor::borrow(mine.data(), {2, 3}, Device::cpu(), DType::f32);
    kernels::fill(kCpu, t.rows(1, 2), 4.0f);
    CHECK(t.device() == Device::cpu());
  }  // the tensor goes; the vector still owns its memory (ASan would see a double free)
  CHECK(mine == std::vector<float>{1, 1, 1, 4, 4, 4});
  CHECK(Tensor::borrow(nullptr, {0, 3}, Device::cpu(), DType::f32).empty());
  CHECK_THROWS_WITH(Tensor::borrow(nullptr, {2}, Device::cpu(), DType::f32),
                    Catch::Contains("Tensor::borrow"));
}
