// The CUDA MoE and router kernels against the CPU ones (kernels/cpu through
// moe_backends.hpp): the expert-major gather, the combine with dropped copies
// over one buffer and over per-expert segments, its backward, the
// scatter-add, the grouped expert GEMM with experts that get no tokens; the
// router's scores (softmax, sigmoid), top-k with ties and bias, weights,
// loads, aux and z losses and the logits' gradient. A rank with zero tokens
// (T = 0) is a valid call everywhere.
#include <algorithm>
#include <memory>
#include <numeric>
#include <random>

#include "harness.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/moe_backends.hpp"

namespace ref = trident::kernels::cpu;
using trident::kernels::RouterDims;
using trident::kernels::RouterScore;
using trident::kernels::RowSource;
using namespace gpu_test;

namespace {

const trident::kernels::Ctx kHost{};  // the CPU reference runs on the host

size_t sz(int64_t n) { return static_cast<size_t>(n); }

// Slot rows of a combine: token t's copy j at row (t * k + j) permuted, every
// fifth copy dropped (-1).
std::vector<int64_t> slot_rows(int64_t T, int k) {
  std::vector<int64_t> row(sz(T * k));
  for (int64_t i = 0; i < T * k; ++i) row[sz(i)] = (i * 7919) % (T * k);
  for (int64_t i = 0; i < T * k; i += 5) row[sz(i)] = -1;
  return row;
}

}  // namespace

GPU_TEST("topk_rows with ties, with and without bias, and zero tokens") {
  const int64_t T = 257;
  const int E = 16, k = 4;
  auto scores = randn(sz(T * E), "scores");
  for (int64_t t = 0; t < T; t += 3) scores[sz(t * E + 5)] = scores[sz(t * E + 9)];  // ties
  const auto bias = randn(sz(E), "bias", 0.3f);
  Buf<float> gs(dc, scores), gb(dc, bias);
  Buf<int> gi(dc, sz(T * k));
  for (bool with_bias : {false, true}) {
    std::vector<int> idx(sz(T * k));
    const float* b = with_bias ? bias.data() : nullptr;
    cuda::topk_rows(dc.ctx(), gs, with_bias ? gb.get() : nullptr, T, E, k, gi);
    ref::topk_rows(kHost, scores.data(), b, T, E, k, idx.data());
    expect(gi.host() == idx, std::string("top-k equals the CPU's (ties to the lower expert)") +
                                 (with_bias ? ", with bias" : ""));
  }
  cuda::topk_rows(dc.ctx(), gs, nullptr, 0, E, k, gi);
}

GPU_TEST("gather, combine (one buffer and segments), combine backward, scatter-add") {
  const int64_t T = 61, d = 45;
  const int k = 3;
  const int64_t n = T * k;
  auto x = randn(sz(T * d), "x"), rows = randn(sz(n * d), "rows");
  auto weight = randn(sz(n), "w"), dy = randn(sz(T * d), "dy");
  const auto row = slot_rows(T, k);
  std::vector<int64_t> src(sz(n));
  for (int64_t i = 0; i < n; ++i) src[sz(i)] = (i * 13) % T;
  Buf<float> gx(dc, x), grows(dc, rows), gw(dc, weight), gdy(dc, dy);
  Buf<int64_t> grow(dc, row), gsrc(dc, src);

  std::vector<float> g(sz(n * d));
  Buf<float> gg(dc, g.size());
  cuda::gather_rows(dc.ctx(), gx, d, gsrc, n, gg);
  ref::gather_rows(kHost, x.data(), d, src.data(), n, g.data());
  check_close("gather_rows", gg.host(), g, 0.0);

  std::vector<float> y(sz(T * d));
  Buf<float> gy(dc, y.size());
  cuda::combine_rows(dc.ctx(), RowSource(grows.get()), d, grow, gw, T, k, gy);
  ref::combine_rows(kHost, RowSource(rows.data()), d, row.data(), weight.data(), T, k, y.data());
  check_close("combine_rows", gy.host(), y, 1e-6);

  // The same rows as three segments in separate buffers (the shm transport's
  // layout), one of them empty: base and first live on the device.
  const std::vector<int64_t> first = {0, 50, 50, n};
  std::vector<std::unique_ptr<Buf<float>>> seg;
  std::vector<const float*> base;
  for (size_t s = 0; s + 1 < first.size(); ++s) {
    std::vector<float> part(rows.begin() + first[s] * d, rows.begin() + first[s + 1] * d);
    seg.push_back(std::make_unique<Buf<float>>(dc, part.empty() ? std::vector<float>(1) : part));
    base.push_back(seg.back()->get());
  }
  Buf<const float*> gbase(dc, base);
  Buf<int64_t> gfirst(dc, first);
  const RowSource segments(gbase.get(), gfirst.get(), int(base.size()));
  cuda::combine_rows(dc.ctx(), segments, d, grow, gw, T, k, gy);
  check_close("combine_rows over segments", gy.host(), y, 1e-6);

  std::vector<float> drows(sz(n * d), 0.0f), dweight(sz(n));
  Buf<float> gdrows(dc, drows.size()), gdweight(dc, dweight.size());
  cuda::combine_rows_backward(dc.ctx(), segments, gdy, d, grow, gw, T, k, gdrows, gdweight);
  ref::combine_rows_backward(kHost, RowSource(rows.data()), dy.data(), d, row.data(), weight.data(),
                             T, k, drows.data(), dweight.data());
  check_close("combine_rows_backward drows", gdrows.host(), drows, 1e-6);
  check_close("combine_rows_backward dweight", gdweight.host(), dweight, 1e-5);

  std::vector<float> dx(sz(T * d));
  Buf<float> gdx(dc, dx.size());
  cuda::scatter_add_rows(dc.ctx(), grows, d, grow, T, k, gdx);
  ref::scatter_add_rows(kHost, rows.data(), d, row.data(), T, k, dx.data());
  check_close("scatter_add_rows", gdx.host(), dx, 1e-6);

  // A rank that received no tokens.
  cuda::gather_rows(dc.ctx(), gx, d, gsrc, 0, gg);
  cuda::combine_rows(dc.ctx(), RowSource(grows.get()), d, grow, gw, 0, k, gy);
  cuda::combine_rows_backward(dc.ctx(), RowSource(grows.get()), gdy, d, grow, gw, 0, k, gdrows,
                              gdweight);
  cuda::scatter_add_rows(dc.ctx(), grows, d, grow, 0, k, gdx);
}

GPU_TEST("grouped expert GEMM with empty experts") {
  const int E = 5;
  const int64_t in = 40, out = 24;
  const std::vector<int64_t> counts = {13, 0, 29, 0, 7};  // experts 1 and 3 get no tokens
  std::vector<int64_t> offsets(sz(E + 1), 0);
  std::partial_sum(counts.begin(), counts.end(), offsets.begin() + 1);
  const int64_t rows = offsets[sz(E)];
  auto x = randn(sz(rows * in), "x");
  std::vector<std::vector<float>> w;
  std::vector<std::unique_ptr<Buf<float>>> gw;
  std::vector<const float*> wptr;
  for (int e = 0; e < E; ++e) {
    w.push_back(randn(sz(in * out), std::string("w").append(std::to_string(e))));
    gw.push_back(std::make_unique<Buf<float>>(dc, w.back()));
    wptr.push_back(gw.back()->get());
  }
  std::vector<float> y(sz(rows * out));
  for (int e = 0; e < E; ++e)
    if (counts[sz(e)] > 0)
      ref::linear_forward(kHost, x.data() + offsets[sz(e)] * in, w[sz(e)].data(), counts[sz(e)], in,
                          out, y.data() + offsets[sz(e)] * out);
  Buf<float> gx(dc, x), gy(dc, y.size());
  cuda::grouped_gemm(dc.ctx(), gx, wptr.data(), offsets.data(), E, in, out, 0.0f, gy);
  check_close("grouped_gemm", gy.host(), y, 1e-5);
}

namespace {

// One router pass on both backends: the GPU's inputs at each stage are the
// CPU's outputs of the stage before, so a 1-ulp difference in a probability
// cannot flip a top-k choice and cascade.
void check_router(cuda::StreamContext& dc, RouterScore score, bool norm_topk, bool bias_on) {
  RouterDims dims;
  dims.T = 300;
  dims.E = 16;
  dims.k = 4;
  dims.score = score;
  dims.norm_topk = norm_topk;
  const int n_samples = 3, E = dims.E, k = dims.k;
  const int64_t T = dims.T;
  const std::string tag = std::string(score == RouterScore::sigmoid ? "sigmoid" : "softmax") +
                          (norm_topk ? " norm" : "") + (bias_on ? " bias" : "");
  const auto logits = randn(sz(T * E), "logits", 2.0f);
  const auto bias = randn(sz(E), "router bias", 0.2f);
  const float* b = bias_on ? bias.data() : nullptr;
  std::vector<int> sample(sz(T));
  for (int64_t t = 0; t < T; ++t) sample[sz(t)] = int(t * n_samples / T);

  std::vector<float> probs(sz(T * E)), lse(sz(T)), weight(sz(T * k));
  std::vector<int> chosen(sz(T * k));
  ref::router_scores(kHost, dims, logits.data(), probs.data(), lse.data());
  Buf<float> glogits(dc, logits), gprobs(dc, probs.size()), glse(dc, lse.size());
  cuda::router_scores(dc.ctx(), dims, glogits, gprobs, glse);
  check_close("router probs " + tag, gprobs.host(), probs, 1e-5);
  check_close("router lse " + tag, glse.host(), lse, 1e-5);

  ref::router_topk(kHost, dims, probs.data(), b, chosen.data(), weight.data());
  Buf<float> gp(dc, probs), gbias(dc, bias), gweight(dc, weight.size());
  Buf<int> gchosen(dc, chosen.size()), gsample(dc, sample);
  cuda::router_topk(dc.ctx(), dims, gp, bias_on ? gbias.get() : nullptr, gchosen, gweight);
  expect(gchosen.host() == chosen, "router chosen experts equal the CPU's (" + tag + ")");
  check_close("router weights " + tag, gweight.host(), weight, 1e-6);

  std::vector<double> stats(sz(n_samples * (E + 1)));
  ref::router_load(kHost, dims, chosen.data(), sample.data(), n_samples, stats.data());
  Buf<int> gch(dc, chosen);
  Buf<double> gstats(dc, stats.size());
  cuda::router_load(dc.ctx(), dims, gch, gsample, n_samples, gstats);
  expect(gstats.host() == stats, "router loads equal the CPU's (" + tag + ")");

  std::vector<double> f(sz(n_samples * E)), inv(sz(n_samples));
  for (int s = 0; s < n_samples; ++s) {
    const double tokens = stats[sz(s * (E + 1) + E)];
    inv[sz(s)] = tokens > 0 ? 1.0 / tokens : 0.0;
    for (int e = 0; e < E; ++e) f[sz(s * E + e)] = stats[sz(s * (E + 1) + e)] * inv[sz(s)] / k;
  }
  {
    std::vector<double> rf(f.size()), rinv(inv.size());
    ref::router_frequencies(kHost, dims, stats.data(), n_samples, rf.data(), rinv.data());
    Buf<double> gfreq(dc, f.size()), ginvt(dc, inv.size());
    cuda::router_frequencies(dc.ctx(), dims, gstats, n_samples, gfreq, ginvt);
    expect(gfreq.host() == rf && ginvt.host() == rinv,
           "router frequencies equal the CPU's bit for bit (" + tag + ")");
  }
  Buf<double> gf(dc, f), ginv(dc, inv), gshares(dc, 2);
  trident::kernels::RouterLossTerms terms{sample.data(), f.data(), inv.data(), 0.01, 0.001};
  trident::kernels::RouterLossTerms gterms{gsample.get(), gf.get(), ginv.get(), 0.01, 0.001};
  double aux = 0, z = 0;
  ref::router_losses(kHost, dims, probs.data(), lse.data(), terms, &aux, &z);
  Buf<float> gl(dc, lse);
  cuda::router_losses(dc.ctx(), dims, gp, gl, gterms, gshares.get(), gshares.get() + 1);
  const auto shares = gshares.host();
  check_close("router aux share " + tag, {float(shares[0])}, {float(aux)}, 1e-6);
  check_close("router z share " + tag, {float(shares[1])}, {float(z)}, 1e-6);

  const auto dweight = randn(sz(T * k), "dweight");
  std::vector<float> dlogits(sz(T * E));
  const trident::kernels::RouterSaved saved{logits.data(), probs.data(), lse.data(), chosen.data(),
                                            weight.data()};
  ref::router_backward(kHost, dims, saved, terms, dweight.data(), 0.7f, dlogits.data());
  Buf<float> gw(dc, weight), gdw(dc, dweight), gdl(dc, dlogits.size());
  const trident::kernels::RouterSaved gsaved{glogits.get(), gp.get(), gl.get(), gch.get(),
                                             gw.get()};
  cuda::router_backward(dc.ctx(), dims, gsaved, gterms, gdw, 0.7f, gdl);
  check_close("router dlogits " + tag, gdl.host(), dlogits, 1e-5);

  RouterDims empty = dims;  // a rank with no tokens
  empty.T = 0;
  cuda::router_scores(dc.ctx(), empty, glogits, gprobs, glse);
  cuda::router_losses(dc.ctx(), empty, gp, gl, gterms, gshares.get(), gshares.get() + 1);
  expect(gshares.host() == std::vector<double>{0.0, 0.0}, "no tokens: zero loss shares");
}

}  // namespace

GPU_TEST("dispatch plan index data and capacity drops on the device") {
  // 3 ranks' copies of 50 tokens, top-2 of 8 experts, weights with ties.
  const int E = 8, k = 2, ranks = 3;
  const int64_t T = 50, n = T * k, N = n * ranks;
  std::vector<int> chosen(sz(N));
  std::vector<float> weight(sz(N));
  std::vector<int64_t> token(sz(T * ranks));
  const auto w = randn(sz(N), "capacity weights");
  for (int64_t i = 0; i < N; ++i) {
    chosen[sz(i)] = int((i * 37 + i / 7) % E);
    if (i % k == 1 && chosen[sz(i)] == chosen[sz(i - 1)]) chosen[sz(i)] = (chosen[sz(i)] + 1) % E;
    weight[sz(i)] = i % 9 == 0 ? 0.25f : w[sz(i)];  // ties on the weight
  }
  for (int64_t t = 0; t < T * ranks; ++t) token[sz(t)] = (t * 13) % (T * ranks);
  Buf<int> gchosen(dc, chosen);
  Buf<float> gweight(dc, weight);
  Buf<int64_t> gtoken(dc, token);
  RouterDims dims;
  dims.T = T;
  dims.E = E;
  dims.k = k;
  for (int me = 0; me < ranks; ++me)
    for (int64_t capacity : {int64_t(3), int64_t(20), int64_t(1000)}) {
      std::vector<int> expert(sz(n));
      int64_t dropped = 0;
      ref::router_capacity(kHost, dims, ranks, me, token.data(), weight.data(), chosen.data(),
                           capacity, expert.data(), &dropped);
      Buf<int> gexpert(dc, sz(n));
      Buf<int64_t> gdropped(dc, 1);
      cuda::router_capacity(dc.ctx(), dims, ranks, me, gtoken, gweight, gchosen, capacity, gexpert,
                            gdropped);
      expect(gexpert.host() == expert && gdropped.host()[0] == dropped,
             "capacity drops equal the CPU's (rank " + std::to_string(me) + ", capacity " +
                 std::to_string(capacity) + ")");

      std::vector<int64_t> counts(sz(E));
      ref::expert_counts(kHost, expert.data(), n, E, counts.data());
      Buf<int64_t> gcounts(dc, sz(E));
      cuda::expert_counts(dc.ctx(), gexpert, n, E, gcounts);
      expect(gcounts.host() == counts, "expert counts equal the CPU's");
      const int64_t S = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      std::vector<int64_t> row_of(sz(n)), send_token(sz(S));
      ref::expert_order(kHost, expert.data(), n, k, E, counts.data(), row_of.data(),
                        send_token.data());
      Buf<int64_t> grow(dc, sz(n)), gsend(dc, sz(std::max<int64_t>(S, 1)));
      cuda::expert_order(dc.ctx(), gexpert, n, k, E, gcounts, grow, gsend);
      auto sent = gsend.host();
      sent.resize(sz(S));
      expect(grow.host() == row_of && sent == send_token,
             "expert-major order (rows and send tokens) equals the CPU's");
    }
}

GPU_TEST("capacity drops on random copies equal the CPU's") {
  // Random groups: tokens in a random order, each token's k distinct experts
  // drawn at random, weights with many ties (a coarse grid, +0 and -0),
  // capacities from "drop everything" past "keep everything".
  std::mt19937_64 rng(23);
  struct Shape {
    int E, k, ranks;
    int64_t T;
  };
  for (const Shape& sh : {Shape{16, 4, 2, 700}, Shape{3, 1, 4, 97}, Shape{64, 8, 3, 129}}) {
    const int64_t n = sh.T * sh.k, N = n * sh.ranks;
    std::vector<int64_t> token(sz(sh.T * sh.ranks));
    std::iota(token.begin(), token.end(), int64_t{0});
    std::shuffle(token.begin(), token.end(), rng);
    std::vector<int> chosen(sz(N)), experts(sz(sh.E));
    std::vector<float> weight(sz(N));
    std::iota(experts.begin(), experts.end(), 0);
    for (int64_t t = 0; t < sh.T * sh.ranks; ++t) {
      std::shuffle(experts.begin(), experts.end(), rng);
      for (int j = 0; j < sh.k; ++j) {
        const int64_t i = t * sh.k + j;
        chosen[sz(i)] = experts[sz(j)];
        const uint64_t r = rng() % 40;
        weight[sz(i)] = r == 0 ? -0.0f : float(r % 12) / 16.0f;  // ties, and -0 == +0
      }
    }
    Buf<int> gchosen(dc, chosen);
    Buf<float> gweight(dc, weight);
    Buf<int64_t> gtoken(dc, token);
    RouterDims dims;
    dims.T = sh.T;
    dims.E = sh.E;
    dims.k = sh.k;
    const int64_t fair = N / sh.E;  // the mean copies per expert
    for (int me = 0; me < sh.ranks; ++me)
      for (int64_t capacity : {int64_t(0), int64_t(1), fair / 2, fair, fair + 1, 2 * fair, N}) {
        std::vector<int> expert(sz(n));
        int64_t dropped = 0;
        ref::router_capacity(kHost, dims, sh.ranks, me, token.data(), weight.data(), chosen.data(),
                             capacity, expert.data(), &dropped);
        Buf<int> gexpert(dc, sz(n));
        Buf<int64_t> gdropped(dc, 1);
        cuda::router_capacity(dc.ctx(), dims, sh.ranks, me, gtoken, gweight, gchosen, capacity,
                              gexpert, gdropped);
        expect(gexpert.host() == expert && gdropped.host()[0] == dropped,
               "random capacity drops equal the CPU's (E " + std::to_string(sh.E) + ", k " +
                   std::to_string(sh.k) + ", rank " + std::to_string(me) + " of " +
                   std::to_string(sh.ranks) + ", capacity " + std::to_string(capacity) + ", " +
                   std::to_string(dropped) + " dropped)");
      }
  }
}

GPU_TEST("router: scores, top-k, weights, loads, losses and backward") {
  check_router(dc, RouterScore::softmax, true, false);
  check_router(dc, RouterScore::softmax, false, false);
  check_router(dc, RouterScore::sigmoid, true, true);
  check_router(dc, RouterScore::sigmoid, false, true);
}
