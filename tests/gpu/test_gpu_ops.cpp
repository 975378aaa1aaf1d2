// The CUDA GEMMs and small ops against their CPU twins (kernels/cpu), on
// random inputs with sizes that are not multiples of any block: fp32 within
// 1e-5 (cuBLAS without TF32); bf16 results within the bounds of harness.hpp;
// gradients that accumulate onto random values compared by their increments.
#include "harness.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/swiglu.hpp"

namespace cpu = trident::kernels;
// The CPU reference implementations, called directly (this build may have no
// routing layer), with a host Ctx.
namespace ref = trident::kernels::cpu;
const trident::kernels::Ctx kHost{};
using namespace gpu_test;

GPU_TEST("sgemm: every transpose, padded strides, beta") {
  const int64_t M = 67, N = 45, K = 131;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
      auto A = randn(static_cast<size_t>((ta ? K : M) * lda), "A"),
           B = randn(static_cast<size_t>((tb ? N : K) * ldb), "B");
      auto C = randn(static_cast<size_t>(M * ldc), "C");
      Buf<float> dA(dc, A), dB(dc, B), dC(dc, C);
      cuda::sgemm(dc.ctx(), ta, tb, M, N, K, 0.7f, dA, lda, dB, ldb, 0.3f, dC, ldc);
      ref::sgemm(kHost, ta, tb, M, N, K, 0.7f, A.data(), lda, B.data(), ldb, 0.3f, C.data(), ldc);
      check_close("sgemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb), dC.host(), C,
                  1e-5);
    }
}

GPU_TEST("gemm bf16 inputs, fp32 accumulation") {
  const int64_t M = 100, N = 72, K = 257;
  auto A = round_bf16(randn(static_cast<size_t>(M * K), "A16")),
       B = round_bf16(randn(static_cast<size_t>(K * N), "B16"));
  Buf<cuda::Bf16> dA(dc, to_bits(A)), dB(dc, to_bits(B));
  Buf<float> dC(dc, static_cast<size_t>(M * N));
  cuda::gemm_bf16(dc.ctx(), false, false, M, N, K, 1.0f, dA, K, dB, N, 0.0f, dC, N);
  std::vector<float> C(static_cast<size_t>(M * N));
  ref::sgemm(kHost, false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  // fp32 output from bf16 operands, exact products: only the accumulation
  // differs. Tensor cores may truncate their fp32 partial sums instead of
  // rounding them (at most one fp32 ulp per add, 2^-23 K = 3e-5 over K = 257,
  // in the worst case), so 1e-4 rather than 1e-5.
  check_close("gemm_bf16", dC.host(), C, 1e-4);
  Buf<cuda::Bf16> dC16(dc, static_cast<size_t>(M * N));
  cuda::gemm_bf16_out(dc.ctx(), false, false, M, N, K, 1.0f, dA, K, dB, N, 0.0f, dC16, N);
  check_close("gemm_bf16_out", from_bits(dC16.host()), C, kBf16Stored + 1e-4);
}

GPU_TEST("linear forward and backward") {
  const int64_t T = 37, in = 48, out = 29;
  auto x = randn(static_cast<size_t>(T * in), "x"), w = randn(static_cast<size_t>(out * in), "w");
  auto dy = randn(static_cast<size_t>(T * out), "dy"),
       dx0 = randn(static_cast<size_t>(T * in), "dx0");
  const auto dw0 = randn(static_cast<size_t>(out * in), "dw0");
  auto dw = dw0;
  Buf<float> gx(dc, x), gw(dc, w), gy(dc, static_cast<size_t>(T * out)), gdy(dc, dy), gdx(dc, dx0),
      gdw(dc, dw);
  std::vector<float> y(static_cast<size_t>(T * out)), dx = dx0;
  cuda::linear_forward(dc.ctx(), gx, gw, T, in, out, gy);
  ref::linear_forward(kHost, x.data(), w.data(), T, in, out, y.data());
  check_close("linear_forward", gy.host(), y, 1e-5);
  cuda::linear_backward_input(dc.ctx(), gdy, gw, T, in, out, gdx, 1.0f);
  ref::linear_backward_input(kHost, dy.data(), w.data(), T, in, out, dx.data(), 1.0f);
  check_increment("linear_backward_input beta=1", gdx.host(), dx, dx0, 1e-5);
  cuda::linear_backward_weight(dc.ctx(), gdy, gx, T, in, out, gdw);
  ref::linear_backward_weight(kHost, dy.data(), x.data(), T, in, out, dw.data());
  check_increment("linear_backward_weight (accumulates)", gdw.host(), dw, dw0, 1e-5);
}

GPU_TEST("rmsnorm forward and backward") {
  // T = 19: one chunk of the weight gradient's rows; 700: eleven, the last
  // one short (plan::rmsnorm_dw_chunks).
  for (const int64_t T : {int64_t(19), int64_t(700)}) {
    const int64_t d = 300;
    auto x = randn(static_cast<size_t>(T * d), "x"), w = randn(static_cast<size_t>(d), "w"),
         dy = randn(static_cast<size_t>(T * d), "dy");
    const auto dw0 = randn(static_cast<size_t>(d), "dw0");
    auto dw = dw0;
    std::vector<float> y(static_cast<size_t>(T * d)), rstd(static_cast<size_t>(T)),
        dx(static_cast<size_t>(T * d));
    Buf<float> gx(dc, x), gw(dc, w), gy(dc, y.size()), gr(dc, rstd.size()), gdy(dc, dy),
        gdx(dc, dx.size()), gdw(dc, dw);
    cuda::rmsnorm_forward(dc.ctx(), gx, gw, T, d, 1e-5f, gy, gr);
    ref::rmsnorm_forward(kHost, x.data(), w.data(), T, d, 1e-5f, y.data(), rstd.data());
    check_close("rmsnorm y", gy.host(), y, 1e-5);
    check_close("rmsnorm rstd", gr.host(), rstd, 1e-5);
    cuda::rmsnorm_backward(dc.ctx(), gdy, gx, gw, gr, T, d, gdx, gdw);
    ref::rmsnorm_backward(kHost, dy.data(), x.data(), w.data(), rstd.data(), T, d, dx.data(),
                          dw.data());
    check_close("rmsnorm dx", gdx.host(), dx, 1e-5);
    check_increment("rmsnorm dw (accumulates) T " + std::to_string(T), gdw.host(), dw, dw0, 1e-5);
  }
}

GPU_TEST("rope forward and backward on global positions") {
  const int64_t T = 23, H = 3, D = 64;
  auto x = randn(static_cast<size_t>(T * H * D), "x");
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) pos[static_cast<size_t>(t)] = 5000 + 37 * t;  // a far CP chunk
  Buf<float> gx(dc, x);
  Buf<int64_t> gp(dc, pos);
  auto want = x;
  cuda::rope_forward(dc.ctx(), gx, gp, T, H, D, 10000.0);
  ref::rope_forward(kHost, want.data(), pos.data(), T, H, D, 10000.0);
  check_close("rope_forward", gx.host(), want, 1e-5);
  cuda::rope_backward(dc.ctx(), gx, gp, T, H, D, 10000.0);
  ref::rope_backward(kHost, want.data(), pos.data(), T, H, D, 10000.0);
  check_close("rope_backward", gx.host(), want, 1e-5);
  check_close("rope round trip", gx.host(), x, 1e-5);
}

GPU_TEST("embedding forward and backward with repeated ids") {
  const int64_t V = 50, d = 33, T = 120;
  auto table = randn(static_cast<size_t>(V * d), "table"),
       dout = randn(static_cast<size_t>(T * d), "dout");
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    ids[static_cast<size_t>(t)] = int32_t((t * 7) % 13);  // many repeats
  auto dtable = randn(static_cast<size_t>(V * d), "dtable0");
  std::vector<float> out(static_cast<size_t>(T * d));
  Buf<float> gt(dc, table), go(dc, out.size()), gdo(dc, dout), gdt(dc, dtable);
  Buf<int32_t> gi(dc, ids);
  cuda::embedding_forward(dc.ctx(), gt, gi, T, d, go);
  ref::embedding_forward(kHost, table.data(), ids.data(), T, d, out.data());
  check_close("embedding_forward", go.host(), out, 0.0);
  cuda::embedding_backward(dc.ctx(), gdo, gi, T, d, gdt);
  ref::embedding_backward(kHost, dout.data(), ids.data(), T, d, dtable.data());
  // Each element adds its tokens in token order, as the CPU does: same bits.
  check_close("embedding_backward (accumulates, CPU order)", gdt.host(), dtable, 0.0);
}

GPU_TEST("cross-entropy with ignored rows") {
  const int64_t T = 41, V = 1000;
  auto logits = randn(static_cast<size_t>(T * V), "logits", 3.0f);
  std::vector<int32_t> targets(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    targets[static_cast<size_t>(t)] = t % 5 == 0 ? -1 : int32_t((t * 31) % V);
  std::vector<float> dl(static_cast<size_t>(T * V));
  Buf<float> gl(dc, logits), gdl(dc, dl.size());
  Buf<int32_t> gt(dc, targets);
  const double got = cuda::cross_entropy(dc.ctx(), gl, gt, T, V, 0.03f, gdl);
  const double want =
      ref::cross_entropy(kHost, logits.data(), targets.data(), T, V, 0.03f, dl.data());
  check_close("cross_entropy loss", {float(got)}, {float(want)}, 1e-6);
  check_close("cross_entropy dlogits", gdl.host(), dl, 1e-5);
  expect(cuda::cross_entropy(dc.ctx(), gl, gt, 0, V, 1.0f, gdl) == 0.0, "T = 0 gives 0");
}

GPU_TEST("adamw over 12 steps with random moments, with and without decay") {
  const int64_t n = 10007;
  for (bool decay : {false, true}) {
    auto p = randn(static_cast<size_t>(n), "p"), m = randn(static_cast<size_t>(n), "m", 0.1f),
         v = randn(static_cast<size_t>(n), "v");
    for (auto& x : v) x = x * x;  // second moments are non-negative
    Buf<float> gp(dc, p), gm(dc, m), gv(dc, v), gg(dc, static_cast<size_t>(n));
    Buf<cuda::Bf16> gp16(dc, static_cast<size_t>(n));
    trident::kernels::AdamWHyper h;
    h.lr = 3e-3;
    h.weight_decay = 0.1;
    for (int step = 1; step <= 12; ++step) {
      auto g = randn(static_cast<size_t>(n), std::string("g").append(std::to_string(step)));
      cuda::copy_to_device(dc.ctx(), gg, g.data(), g.size() * sizeof(float));
      cuda::adamw_step_bf16(dc.ctx(), gp, gg, gm, gv, gp16, n, h, step, 0.8f, decay);
      ref::adamw_step(kHost, p.data(), g.data(), m.data(), v.data(), n, h, step, 0.8f, decay);
    }
    const std::string tag = decay ? " (decay)" : "";
    check_close("adamw p" + tag, gp.host(), p, 1e-5);
    check_close("adamw m" + tag, gm.host(), m, 1e-5);
    check_close("adamw v" + tag, gv.host(), v, 1e-5);
    // The bf16 copy of the fp32 result: one rounding, plus the fp32 tolerance.
    check_close("adamw bf16 copy" + tag, from_bits(gp16.host()), p, kBf16Stored + 1e-5);
  }
}

GPU_TEST("sum_squares_ranges: every range's sum, an empty one, and a NaN") {
  const int64_t n = 300007;
  auto x = randn(static_cast<size_t>(n), "ranges x");
  x[200000] = NAN;  // inside the third range only
  const std::vector<int64_t> ranges = {0, 1000, 1000, 1000, 150000, 250000, 250000, n, 7, 8};
  const int64_t count = int64_t(ranges.size()) / 2;
  std::vector<double> want(static_cast<size_t>(count));
  ref::sum_squares_ranges(kHost, x.data(), ranges.data(), count, want.data());
  Buf<float> gx(dc, x);
  Buf<int64_t> gr(dc, ranges);
  Buf<double> gs(dc, static_cast<size_t>(count));
  cuda::sum_squares_ranges(dc.ctx(), gx, gr, count, gs);
  const auto got = gs.host();
  for (int64_t k = 0; k < count; ++k) {
    const double g = got[size_t(k)], w = want[size_t(k)];
    const std::string what = "range " + std::to_string(k);
    if (std::isnan(w)) {
      expect(std::isnan(g), what + ": NaN as on the CPU");
    } else {
      expect(std::fabs(g - w) <= 1e-12 * std::max(1.0, w),
             what + ": " + std::to_string(g) + " vs " + std::to_string(w));
    }
  }
  expect(got[1] == 0.0, "an empty range sums to 0");
}

GPU_TEST("add_inplace, copy, fill, sum_squares, bf16 conversion") {
  const int64_t n = 100003;
  auto x = randn(static_cast<size_t>(n), "x"), y = randn(static_cast<size_t>(n), "y");
  Buf<float> gx(dc, x), gy(dc, y);
  cuda::add_inplace(dc.ctx(), gy, gx, n);
  ref::add_inplace(kHost, y.data(), x.data(), n);
  check_close("add_inplace", gy.host(), y, 0.0);
  Buf<float> gc(dc, static_cast<size_t>(n));
  cuda::copy(dc.ctx(), gc, gx, n);
  check_close("copy", gc.host(), x, 0.0);
  cuda::fill(dc.ctx(), gc, n, 2.5f);
  check_close("fill", gc.host(), std::vector<float>(static_cast<size_t>(n), 2.5f), 0.0);
  const double ss = cuda::sum_squares(dc.ctx(), gx, n);
  check_close("sum_squares", {float(ss)}, {float(ref::sum_squares(kHost, x.data(), n))}, 1e-6);
  for (int rep = 0; rep < 3; ++rep)  // no atomics: the same bits every time
    expect(cuda::sum_squares(dc.ctx(), gx, n) == ss, "sum_squares reproducible bit for bit");
  Buf<cuda::Bf16> g16(dc, static_cast<size_t>(n));
  cuda::to_bf16(dc.ctx(), gx, n, g16);
  check_close("to_bf16 (round to nearest even, as the host)", from_bits(g16.host()), round_bf16(x),
              0.0);
  Buf<float> back(dc, static_cast<size_t>(n));
  cuda::to_f32(dc.ctx(), g16, n, back);
  check_close("to_f32", back.host(), round_bf16(x), 0.0);
}

GPU_TEST("swiglu forward and backward") {
  const int64_t T = 45, d = 64, f = 96;
  auto x = randn(static_cast<size_t>(T * d), "x"),
       wg = randn(static_cast<size_t>(d * f), "wg", 0.2f);
  auto wu = randn(static_cast<size_t>(d * f), "wu", 0.2f),
       wd = randn(static_cast<size_t>(f * d), "wd", 0.2f);
  auto dy = randn(static_cast<size_t>(T * d), "dy");
  std::vector<float> y(static_cast<size_t>(T * d)), gate(static_cast<size_t>(T * f)),
      up(static_cast<size_t>(T * f)), dx(static_cast<size_t>(T * d));
  auto dwg = randn(wg.size(), "dwg0"), dwu = randn(wu.size(), "dwu0"),
       dwd = randn(wd.size(), "dwd0");
  Buf<float> gx(dc, x), gwg(dc, wg), gwu(dc, wu), gwd(dc, wd), gy(dc, y.size()),
      ggate(dc, gate.size()), gup(dc, up.size()), gdy(dc, dy), gdx(dc, dx.size()), gdwg(dc, dwg),
      gdwu(dc, dwu), gdwd(dc, dwd);
  cuda::swiglu_forward(dc.ctx(), gx, T, d, f, gwg, gwu, gwd, gy, ggate, gup);
  ref::swiglu_forward(kHost, x.data(), T, d, f, wg.data(), wu.data(), wd.data(), y.data(),
                      gate.data(), up.data());
  check_close("swiglu y", gy.host(), y, 1e-5);
  check_close("swiglu gate", ggate.host(), gate, 1e-5);
  cuda::swiglu_backward(dc.ctx(), gx, ggate, gup, gdy, T, d, f, gwg, gwu, gwd, gdx, gdwg, gdwu,
                        gdwd);
  ref::swiglu_backward(kHost, x.data(), gate.data(), up.data(), dy.data(), T, d, f, wg.data(),
                       wu.data(), wd.data(), dx.data(), dwg.data(), dwu.data(), dwd.data());
  check_close("swiglu dx", gdx.host(), dx, 1e-5);
  check_close("swiglu dw_gate", gdwg.host(), dwg, 1e-5);
  check_close("swiglu dw_up", gdwu.host(), dwu, 1e-5);
  check_close("swiglu dw_down", gdwd.host(), dwd, 1e-5);
}
