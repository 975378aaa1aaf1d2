// The CUDA MoE token kernels against the CPU ones: top-k with ties, the
// expert-major gather, combine with dropped copies and its backward, the
// scatter-add, and the grouped expert GEMM with experts that get no tokens;
// a rank with zero tokens (T = 0) is a valid call everywhere.
#include <memory>
#include <numeric>

#include "harness.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/kernels/moe.hpp"
#include "trident/kernels/router.hpp"

namespace cpu = trident::kernels;
using namespace gpu_test;

namespace {

const trident::kernels::Ctx kHost{};  // the CPU reference runs on the host

// Slot rows of a combine: token t's copy j at row (t * k + j) permuted, every
// fifth copy dropped (-1).
std::vector<int64_t> slot_rows(int64_t T, int k) {
  std::vector<int64_t> row(static_cast<size_t>(T * k));
  for (int64_t i = 0; i < T * k; ++i) row[static_cast<size_t>(i)] = (i * 7919) % (T * k);
  for (int64_t i = 0; i < T * k; i += 5) row[static_cast<size_t>(i)] = -1;
  return row;
}

}  // namespace

GPU_TEST("topk_rows with ties and zero tokens") {
  const int64_t T = 257;
  const int E = 16, k = 4;
  auto scores = randn(static_cast<size_t>(T * E), "scores");
  for (int64_t t = 0; t < T; t += 3)
    scores[static_cast<size_t>(t * E + 5)] = scores[static_cast<size_t>(t * E + 9)];  // ties
  std::vector<int> idx(static_cast<size_t>(T * k));
  Buf<float> gs(dc, scores);
  Buf<int> gi(dc, idx.size());
  cuda::topk_rows(dc.ctx(), gs, T, E, k, gi);
  cpu::topk_rows(kHost, scores.data(), nullptr, T, E, k, idx.data());
  expect(gi.host() == idx, "top-k indices equal the CPU's (ties to the lower expert)");
  cuda::topk_rows(dc.ctx(), gs, 0, E, k, gi);
}

GPU_TEST("gather, combine, combine backward, scatter-add") {
  const int64_t T = 61, d = 45;
  const int k = 3;
  const int64_t n = T * k;
  auto x = randn(static_cast<size_t>(T * d), "x"), rows = randn(static_cast<size_t>(n * d), "rows");
  auto weight = randn(static_cast<size_t>(n), "w"), dy = randn(static_cast<size_t>(T * d), "dy");
  const auto row = slot_rows(T, k);
  std::vector<int64_t> src(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) src[static_cast<size_t>(i)] = (i * 13) % T;
  Buf<float> gx(dc, x), grows(dc, rows), gw(dc, weight), gdy(dc, dy);
  Buf<int64_t> grow(dc, row), gsrc(dc, src);

  std::vector<float> g(static_cast<size_t>(n * d));
  Buf<float> gg(dc, g.size());
  cuda::gather_rows(dc.ctx(), gx, d, gsrc, n, gg);
  cpu::gather_rows(kHost, x.data(), d, src.data(), n, g.data());
  check_close("gather_rows", gg.host(), g, 0.0);

  std::vector<float> y(static_cast<size_t>(T * d));
  Buf<float> gy(dc, y.size());
  cuda::combine_rows(dc.ctx(), grows, d, grow, gw, T, k, gy);
  cpu::combine_rows(kHost, rows.data(), d, row.data(), weight.data(), T, k, y.data());
  check_close("combine_rows", gy.host(), y, 1e-6);

  std::vector<float> drows(static_cast<size_t>(n * d), 0.0f), dweight(static_cast<size_t>(n));
  Buf<float> gdrows(dc, drows.size()), gdweight(dc, dweight.size());
  cuda::combine_rows_backward(dc.ctx(), grows, gdy, d, grow, gw, T, k, gdrows, gdweight);
  cpu::combine_rows_backward(kHost, rows.data(), dy.data(), d, row.data(), weight.data(), T, k,
                             drows.data(), dweight.data());
  check_close("combine_rows_backward drows", gdrows.host(), drows, 1e-6);
  check_close("combine_rows_backward dweight", gdweight.host(), dweight, 1e-5);

  std::vector<float> dx(static_cast<size_t>(T * d));
  Buf<float> gdx(dc, dx.size());
  cuda::scatter_add_rows(dc.ctx(), grows, d, grow, T, k, gdx);
  cpu::scatter_add_rows(kHost, rows.data(), d, row.data(), T, k, dx.data());
  check_close("scatter_add_rows", gdx.host(), dx, 1e-6);

  // A rank that received no tokens.
  cuda::gather_rows(dc.ctx(), gx, d, gsrc, 0, gg);
  cuda::combine_rows(dc.ctx(), grows, d, grow, gw, 0, k, gy);
  cuda::combine_rows_backward(dc.ctx(), grows, gdy, d, grow, gw, 0, k, gdrows, gdweight);
  cuda::scatter_add_rows(dc.ctx(), grows, d, grow, 0, k, gdx);
}

GPU_TEST("grouped expert GEMM with empty experts") {
  const int E = 5;
  const int64_t in = 40, out = 24;
  const std::vector<int64_t> counts = {13, 0, 29, 0, 7};  // experts 1 and 3 get no tokens
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1), 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  const int64_t rows = offsets[static_cast<size_t>(E)];
  auto x = randn(static_cast<size_t>(rows * in), "x");
  std::vector<std::vector<float>> w;
  std::vector<std::unique_ptr<Buf<float>>> gw;
  std::vector<const float*> wptr;
  for (int e = 0; e < E; ++e) {
    w.push_back(randn(static_cast<size_t>(in * out), std::string("w").append(std::to_string(e))));
    gw.push_back(std::make_unique<Buf<float>>(dc, w.back()));
    wptr.push_back(gw.back()->get());
  }
  std::vector<float> y(static_cast<size_t>(rows * out));
  for (int e = 0; e < E; ++e)
    if (counts[static_cast<size_t>(e)] > 0)
      cpu::sgemm(false, false, counts[static_cast<size_t>(e)], out, in, 1.0f,
                 x.data() + offsets[static_cast<size_t>(e)] * in, in,
                 w[static_cast<size_t>(e)].data(), out, 0.0f,
                 y.data() + offsets[static_cast<size_t>(e)] * out, out);
  Buf<float> gx(dc, x), gy(dc, y.size());
  cuda::grouped_gemm(dc.ctx(), gx, wptr.data(), offsets.data(), E, in, out, 0.0f, gy);
  check_close("grouped_gemm", gy.host(), y, 1e-5);
}
