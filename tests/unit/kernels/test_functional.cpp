// The ops on tensors (kernels/functional.hpp): shapes and dtypes taken from
// the tensors, the same f32 results as the pointer form bit for bit, bf16
// rounding to nearest even, bf16 staging equal to rounding by hand, and one
// clear error for a tensor of the wrong dtype, size or device.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernel_ctx.hpp"
#include "random.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/swiglu.hpp"
#include "trident/kernels/tensor_ops.hpp"

using namespace trident;
using trident::testing::random_tensor;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bf16 of x by the definition: the nearest of the two bf16 neighbours, the
// even one on a tie (computed in double, independently of the kernel's bit trick).
uint16_t bf16_reference(float x) {
  const uint32_t u = bits(x);
  const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
  const double dlo = std::fabs(double(from_bits(lo)) - double(x));
  // Past the largest bf16 the upper neighbour is infinity, which IEEE rounding
  // places where the next binade would start (2^128 for positive numbers).
  const double hi_value = (hi & 0x7f800000u) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), x)
                                                            : double(from_bits(hi));
  const double dhi = std::fabs(hi_value - double(x));
  if (dlo < dhi) return uint16_t(lo >> 16);
  if (dhi < dlo) return uint16_t(hi >> 16);
  return ((lo >> 16) & 1u) ? uint16_t(hi >> 16) : uint16_t(lo >> 16);
}

Tensor to_bf16_tensor(const Tensor& f) {
  Tensor b = Tensor::empty(f.shape(), cpu_allocator(), DType::bf16);
  kernels::convert(test::kernel_ctx(), f, b);
  return b;
}

Tensor to_f32_tensor(const Tensor& b) {
  Tensor f = Tensor::empty(b.shape(), cpu_allocator(), DType::f32);
  kernels::convert(test::kernel_ctx(), b, f);
  return f;
}

// x rounded to bf16 and back, as f32.
Tensor rounded(const Tensor& x) { return to_f32_tensor(to_bf16_tensor(x)); }

}  // namespace

TEST_CASE("f32 -> bf16 rounds to nearest even, keeps NaN and infinities", "[functional][bf16]") {
  std::vector<float> xs = {1.0f, -2.5f, 3.14159265f, 1e-30f, -1e30f, 65504.0f};
  // Exact ties: the bf16 neighbours of 1 + 2^-8 and 1 + 3 * 2^-8 are even/odd pairs.
  xs.push_back(from_bits(0x3f808000u));  // halfway between 0x3f80 and 0x3f81: to 0x3f80
  xs.push_back(from_bits(0x3f818000u));  // halfway between 0x3f81 and 0x3f82: to 0x3f82
  xs.push_back(from_bits(0x3f808001u));  // just above halfway: up
  xs.push_back(from_bits(0x7f7fffffu));  // the largest float rounds up to infinity
  Tensor r = random_tensor({64}, 17, 10.0f);
  for (int64_t i = 0; i < r.numel(); ++i) xs.push_back(r[i]);
  Tensor x({int64_t(xs.size())});
  for (size_t i = 0; i < xs.size(); ++i) x[int64_t(i)] = xs[i];
  Tensor b = to_bf16_tensor(x);
  const uint16_t* pb = b.data<uint16_t>();
  for (size_t i = 0; i < xs.size(); ++i) {
    INFO("x = " << xs[i]);
    REQUIRE(pb[i] == bf16_reference(xs[i]));
  }
  REQUIRE(pb[6] == 0x3f80);
  REQUIRE(pb[7] == 0x3f82);
  REQUIRE(pb[8] == 0x3f81);
  REQUIRE(pb[9] == 0x7f80);  // +inf

  Tensor special({3});
  special[0] = std::numeric_limits<float>::quiet_NaN();
  special[1] = std::numeric_limits<float>::infinity();
  special[2] = -std::numeric_limits<float>::infinity();
  Tensor back = rounded(special);
  REQUIRE(std::isnan(back[0]));
  REQUIRE(back[1] == std::numeric_limits<float>::infinity());
  REQUIRE(back[2] == -std::numeric_limits<float>::infinity());
  // bf16 -> f32 is exact: a second round trip changes nothing.
  Tensor once = rounded(x), twice = rounded(once);
  for (int64_t i = 0; i < x.numel(); ++i)
    if (!std::isnan(once[i])) REQUIRE(bits(once[i]) == bits(twice[i]));
}

TEST_CASE("tensor ops equal the pointer ops bit for bit in f32", "[functional]") {
  const auto& ctx = test::kernel_ctx();
  const int64_t T = 37, d = 24, f = 40, V = 19;
  Tensor x = random_tensor({T, d}, 1), w = random_tensor({f, d}, 2, 0.2f);
  Tensor y1({T, f}), y2({T, f});
  kernels::linear_forward(ctx, x, w, y1);
  kernels::linear_forward(ctx, x.ptr(), w.ptr(), T, d, f, y2.ptr());
  REQUIRE(std::memcmp(y1.ptr(), y2.ptr(), y1.bytes()) == 0);

  Tensor dy = random_tensor({T, f}, 3), dx1({T, d}), dx2({T, d}), dw1({f, d}), dw2({f, d});
  kernels::linear_backward_input(ctx, dy, w, dx1);
  kernels::linear_backward_input(ctx, dy.ptr(), w.ptr(), T, d, f, dx2.ptr());
  kernels::linear_backward_weight(ctx, dy, x, dw1);
  kernels::linear_backward_weight(ctx, dy.ptr(), x.ptr(), T, d, f, dw2.ptr());
  REQUIRE(std::memcmp(dx1.ptr(), dx2.ptr(), dx1.bytes()) == 0);
  REQUIRE(std::memcmp(dw1.ptr(), dw2.ptr(), dw1.bytes()) == 0);

  Tensor wg = random_tensor({f, d}, 4, 0.2f), wu = random_tensor({f, d}, 5, 0.2f),
         wd = random_tensor({d, f}, 6, 0.2f);
  Tensor o1({T, d}), o2({T, d}), g1({T, f}), g2({T, f}), u1({T, f}), u2({T, f});
  kernels::swiglu_forward(ctx, x, wg, wu, wd, o1, g1, u1);
  kernels::swiglu_forward(ctx, x.ptr(), T, d, f, wg.ptr(), wu.ptr(), wd.ptr(), o2.ptr(), g2.ptr(),
                          u2.ptr());
  REQUIRE(std::memcmp(o1.ptr(), o2.ptr(), o1.bytes()) == 0);

  Tensor table = random_tensor({V, d}, 7);
  Tensor ids = Tensor::empty({T}, cpu_allocator(), DType::i32);
  for (int64_t t = 0; t < T; ++t) ids.data<int32_t>()[t] = int32_t((t * 7) % V);
  Tensor e1({T, d}), e2({T, d});
  kernels::embedding_forward(ctx, table, ids, e1);
  kernels::embedding_forward(ctx, table.ptr(), ids.data<int32_t>(), T, d, e2.ptr());
  REQUIRE(std::memcmp(e1.ptr(), e2.ptr(), e1.bytes()) == 0);

  Tensor logits = random_tensor({T, V}, 8), dl1({T, V}), dl2({T, V});
  const double l1 = kernels::cross_entropy(ctx, logits, ids, 0.25f, dl1);
  const double l2 =
      kernels::cross_entropy(ctx, logits.ptr(), ids.data<int32_t>(), T, V, 0.25f, dl2.ptr());
  REQUIRE(l1 == l2);
  REQUIRE(std::memcmp(dl1.ptr(), dl2.ptr(), dl1.bytes()) == 0);
}

TEST_CASE("a bf16 tensor is staged: inputs widened, outputs rounded to nearest even",
          "[functional][bf16]") {
  const auto& ctx = test::kernel_ctx();
  const int64_t T = 29, d = 16, f = 24;
  Tensor x = random_tensor({T, d}, 11), w = random_tensor({f, d}, 12, 0.3f);
  // bf16 x and w, bf16 y: the f32 GEMM of the rounded inputs, rounded.
  Tensor xb = to_bf16_tensor(x), wb = to_bf16_tensor(w);
  Tensor yb = Tensor::empty({T, f}, cpu_allocator(), DType::bf16);
  kernels::linear_forward(ctx, xb, wb, yb);
  Tensor want({T, f});
  kernels::linear_forward(ctx, rounded(x), rounded(w), want);
  Tensor want_b = to_bf16_tensor(want);
  REQUIRE(std::memcmp(yb.data<uint16_t>(), want_b.data<uint16_t>(), yb.bytes()) == 0);
  // A bf16 run is not the f32 run: rounding moved the result.
  Tensor y32({T, f});
  kernels::linear_forward(ctx, x, w, y32);
  REQUIRE(std::memcmp(to_f32_tensor(yb).ptr(), y32.ptr(), y32.bytes()) != 0);
  // ... and stays within what bf16 inputs allow: |rel| <= a few units of 2^-8.
  REQUIRE(rel_l2_diff(to_f32_tensor(yb), y32) < 1e-2);

  // An accumulating output in bf16 is widened before the kernel adds to it.
  Tensor dy = random_tensor({T, f}, 13), dwb = to_bf16_tensor(random_tensor({f, d}, 14));
  Tensor dw_want = to_f32_tensor(dwb);
  kernels::linear_backward_weight(ctx, dy, x, dwb);
  kernels::linear_backward_weight(ctx, dy, x, dw_want);
  Tensor dw_want_b = to_bf16_tensor(dw_want);
  REQUIRE(std::memcmp(dwb.data<uint16_t>(), dw_want_b.data<uint16_t>(), dwb.bytes()) == 0);
}

TEST_CASE("tensor ops name the tensor that breaks their contract", "[functional]") {
  const auto& ctx = test::kernel_ctx();
  Tensor x = random_tensor({4, 8}, 1), w = random_tensor({6, 8}, 2), y({4, 5});
  REQUIRE_THROWS_WITH(kernels::linear_forward(ctx, x, w, y),
                      Catch::Contains("linear_forward: y [4, 5] f32 should hold 24 elements"));
  Tensor x_bad = random_tensor({4, 7}, 1);
  REQUIRE_THROWS_WITH(kernels::linear_forward(ctx, x_bad, w, Tensor({4, 6})),
                      Catch::Contains("is not a whole number of rows of 8"));
  Tensor table = random_tensor({10, 8}, 3), out({4, 8});
  Tensor ids64 = Tensor::empty({4}, cpu_allocator(), DType::i64);
  REQUIRE_THROWS_WITH(kernels::embedding_forward(ctx, table, ids64, out),
                      Catch::Contains("ids [4] i64 should be i32"));
  Tensor pos32 = Tensor::empty({4}, cpu_allocator(), DType::i32);
  REQUIRE_THROWS_WITH(kernels::rope_forward(ctx, Tensor({4, 2, 4}), pos32, 4, 1e4),
                      Catch::Contains("pos [4] i32 should be i64"));
  Tensor idx = Tensor::empty({32}, cpu_allocator(), DType::i32);
  REQUIRE_THROWS_WITH(kernels::add_inplace(ctx, Tensor({32}), idx),
                      Catch::Contains("x [32] i32 should be float data (f32 or bf16)"));
}

TEST_CASE("a packed weight operand that is not the weight's own is one clear error",
          "[functional][bf16]") {
  // on every CPU: the check precedes the rows (a PackedBf16Weight has forms
  // only on the native bf16 path; the operand is checked either way)
  const auto& ctx = test::kernel_ctx();
  const int64_t T = 4, d = 8, f = 6;
  Tensor x = random_tensor({T, d}, 1), wg = random_tensor({f, d}, 2), wu = random_tensor({f, d}, 3),
         wd = random_tensor({d, f}, 4), y({T, d}), gate({T, f}), up({T, f}), lin({T, f});
  const kernels::PackedBf16Weight pg(ctx, wg), pu(ctx, wu),
      pd(ctx, wd);  // never refreshed: refused first
  REQUIRE_THROWS_WITH(kernels::linear_forward(ctx, x, wg, lin, &pd),
                      "kernels::linear_forward: packed w is the packed form of [8, 6] f32, not of "
                      "w [6, 8] f32");
  REQUIRE_THROWS_WITH(kernels::linear_backward_input(ctx, lin, wg, x, 0.0f, &pu),
                      Catch::Contains("packed w is the packed form of another tensor [6, 8] f32"));
  REQUIRE_THROWS_WITH(
      kernels::swiglu_forward(ctx, x, wg, wu, wd, y, gate, up, {&pg, &pu, &pu}),
      Catch::Contains("swiglu_forward: packed w_down is the packed form of [6, 8]"));
  Tensor dx({T, d}), dwg({f, d}), dwu({f, d}), dwd({d, f});
  REQUIRE_THROWS_WITH(kernels::swiglu_backward(ctx, x, gate, up, y, wg, wu, wd, dx, dwg, dwu, dwd,
                                               {&pu, nullptr, nullptr}),
                      Catch::Contains("swiglu_backward: packed w_gate is the packed form of "
                                      "another tensor"));
}

TEST_CASE("the ring's resume and the step guard's range sums as tensor ops", "[functional]") {
  const auto& ctx = test::kernel_ctx();
  // Two key sets: a forward over the first, resumed over the second, equals
  // the pointer form bit for bit (the ring's per-step LSE merge).
  kernels::AttnShape s;
  s.Tq = 21, s.Tk = 13, s.H = 4, s.Hkv = 2, s.D = 8;
  s.scale = 1.0f / std::sqrt(8.0f);
  s.causal = true, s.q_pos0 = 13, s.k_pos0 = 0;
  Tensor q = random_tensor({s.Tq, s.H, s.D}, 21), k = random_tensor({s.Tk, s.Hkv, s.D}, 22),
         v = random_tensor({s.Tk, s.Hkv, s.D}, 23);
  Tensor o1({s.Tq, s.H, s.D}), l1({s.Tq, s.H}), o2({s.Tq, s.H, s.D}), l2({s.Tq, s.H});
  kernels::attention_forward(ctx, s, q, k, v, o1, l1);
  kernels::attention_forward(ctx, s, q, k, v, o2, l2);
  kernels::AttnShape later = s;
  later.k_pos0 = 13, later.Tk = 21;
  Tensor k2 = random_tensor({later.Tk, s.Hkv, s.D}, 24),
         v2 = random_tensor({later.Tk, s.Hkv, s.D}, 25);
  kernels::attention_forward_resume(ctx, later, q, k2, v2, o1, l1);
  kernels::attention_forward_resume(ctx, later, q.ptr(), k2.ptr(), v2.ptr(), o2.ptr(), l2.ptr());
  REQUIRE(std::memcmp(o1.ptr(), o2.ptr(), o1.bytes()) == 0);
  REQUIRE(std::memcmp(l1.ptr(), l2.ptr(), l1.bytes()) == 0);
  REQUIRE_THROWS_WITH(
      kernels::attention_forward_resume(ctx, later, q, k, v2, o1, l1),
      Catch::Contains("attention_forward_resume: k [13, 2, 8] f32 should hold 336 elements"));

  // Range sums into f64, from i64 ranges: the pointer form's, and a bf16 x
  // staged to f32 sums what its f32 widening sums.
  Tensor x = random_tensor({50}, 26);
  Tensor ranges = Tensor::empty({6}, cpu_allocator(), DType::i64);
  const int64_t r[] = {0, 10, 10, 10, 12, 50};
  std::memcpy(ranges.data<int64_t>(), r, sizeof r);
  Tensor sums = Tensor::empty({3}, cpu_allocator(), DType::f64);
  std::vector<double> want(3);
  kernels::sum_squares_ranges(ctx, x, ranges, sums);
  kernels::sum_squares_ranges(ctx, x.ptr(), ranges.data<int64_t>(), 3, want.data());
  for (int i = 0; i < 3; ++i) REQUIRE(sums.data<double>()[i] == want[size_t(i)]);
  REQUIRE(sums.data<double>()[1] == 0.0);
  Tensor xb = to_bf16_tensor(x);
  kernels::sum_squares_ranges(ctx, xb, ranges, sums);
  kernels::sum_squares_ranges(ctx, to_f32_tensor(xb).ptr(), ranges.data<int64_t>(), 3, want.data());
  for (int i = 0; i < 3; ++i) REQUIRE(sums.data<double>()[i] == want[size_t(i)]);
  REQUIRE_THROWS_WITH(kernels::sum_squares_ranges(ctx, x, ranges, Tensor({3})),
                      Catch::Contains("sums [3] f32 should be f64"));
  REQUIRE_THROWS_WITH(kernels::sum_squares_ranges(ctx, x, ranges.view(0, {4}), sums),
                      Catch::Contains("ranges [4] i64 should hold 6 elements"));
}
