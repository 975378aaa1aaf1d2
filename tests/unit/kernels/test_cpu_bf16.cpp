// The CPU's native bf16 path (kernels/include/trident/kernels/cpu_bf16.hpp): the
// bf16 GEMM against an fp64 sum of the bf16-rounded inputs (every layout of
// A and B, f32 or bf16 operands, tails of M, N and K, K odd and past a K
// block, alpha and beta, nothing written outside C), its bf16 output, the
// op-table rows against the staged rows, the native attention against the
// fp32 attention, and TRIDENT_CPU_BF16. The process
// exits 77 (ctest: skipped) on a CPU without AVX512-BF16, which has only the
// staged path (tested in test_functional and test_emulated_ops).
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <vector>

#include "attention_bf16_tile.hpp"
#include "kernel_ctx.hpp"
#include "random.hpp"
#include "swiglu_gating.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/backends.hpp"
#include "trident/kernels/cpu_bf16.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/kernels/types/gemm_bf16.hpp"

using namespace trident;
using trident::testing::randn;
namespace cpu = kernels::cpu;

namespace {

void need_bf16_units() {
  if (cpu::bf16_units().avx512_bf16) return;
  std::printf("SKIP: this CPU has no AVX512-BF16 (vdpbf16ps): only the staged bf16 path runs\n");
  std::exit(77);
}

float widen(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::vector<uint16_t> rounded(const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  kernels::cpu::to_bf16(test::kernel_ctx(), x.data(), int64_t(x.size()), y.data());
  return y;
}

struct Case {
  int64_t M, N, K;
  bool ta, tb, a_f32, b_f32;
  float alpha, beta;
};

// Runs one case with C at a row stride wider than N (sentinels around the
// block) and checks every element against the fp64 sum of the rounded
// inputs: |C - ref| <= 2e-6 (sum |alpha a b| + |beta c|), fp32 accumulation.
void check(const Case& c) {
  INFO("M " << c.M << " N " << c.N << " K " << c.K << " ta " << c.ta << " tb " << c.tb << " a_f32 "
            << c.a_f32 << " b_f32 " << c.b_f32 << " beta " << c.beta);
  const int64_t lda = (c.ta ? c.M : c.K) + 3, ldb = (c.tb ? c.K : c.N) + 5, ldc = c.N + 7;
  const int64_t a_rows = c.ta ? c.K : c.M, b_rows = c.tb ? c.N : c.K;
  const std::vector<float> A = randn(size_t(std::max<int64_t>(a_rows * lda, 1)), 1);
  const std::vector<float> B = randn(size_t(std::max<int64_t>(b_rows * ldb, 1)), 2);
  const std::vector<uint16_t> Ab = rounded(A), Bb = rounded(B);
  const float sentinel = 12345.0f;
  std::vector<float> C = randn(size_t(c.M * ldc), 3), C0;
  for (int64_t i = 0; i < c.M; ++i)
    std::fill(C.begin() + i * ldc + c.N, C.begin() + (i + 1) * ldc, sentinel);
  C0 = C;
  const cpu::Bf16Operand a{c.a_f32 ? static_cast<const void*>(A.data()) : Ab.data(), c.a_f32, c.ta,
                           lda};
  const cpu::Bf16Operand b{c.b_f32 ? static_cast<const void*>(B.data()) : Bb.data(), c.b_f32, c.tb,
                           ldb};
  cpu::gemm_bf16(c.M, c.N, c.K, c.alpha, a, b, c.beta, C.data(), ldc);
  double worst = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double sum = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double x = widen(Ab[size_t(c.ta ? k * lda + i : i * lda + k)]);
        const double y = widen(Bb[size_t(c.tb ? j * ldb + k : k * ldb + j)]);
        sum += x * y;
        mag += std::fabs(x * y);
      }
      const double c0 = C0[size_t(i * ldc + j)];
      const double ref = c.alpha * sum + (c.beta == 0.0f ? 0.0 : c.beta * c0);
      const double bound = 2e-6 * (std::fabs(c.alpha) * mag + std::fabs(c.beta * c0)) + 1e-30;
      worst = std::max(worst, std::fabs(C[size_t(i * ldc + j)] - ref) / bound);
    }
    for (int64_t j = c.N; j < ldc; ++j) REQUIRE(C[size_t(i * ldc + j)] == sentinel);
  }
  REQUIRE(worst <= 1.0);
}

// A bf16 tensor of standard normal values (drawn in f32 by key, rounded).
Tensor normal_bf16(const kernels::Ctx& ctx, std::vector<int64_t> shape, uint64_t key) {
  Tensor x(shape);
  rng::fill_normal(x.ptr(), x.numel(), key, 0, 1.0f);
  Tensor b = Tensor::empty(shape, cpu_allocator(), DType::bf16);
  kernels::convert(ctx, x, b);
  return b;
}

}  // namespace

TEST_CASE("TRIDENT_CPU_BF16 takes staged, native or auto; anything else is one clear error",
          "[cpu_bf16]") {
  const char* old = std::getenv("TRIDENT_CPU_BF16");
  const std::string saved = old ? old : "";
  ::setenv("TRIDENT_CPU_BF16", "staged", 1);
  REQUIRE(cpu::bf16_mode_from_env() == cpu::Bf16Mode::staged);
  ::setenv("TRIDENT_CPU_BF16", "native", 1);
  REQUIRE(cpu::bf16_mode_from_env() == cpu::Bf16Mode::native);
  ::setenv("TRIDENT_CPU_BF16", "", 1);
  REQUIRE(cpu::bf16_mode_from_env() == cpu::Bf16Mode::automatic);
  ::setenv("TRIDENT_CPU_BF16", "fast", 1);
  REQUIRE_THROWS_AS(cpu::bf16_mode_from_env(), InputError);
  REQUIRE_THROWS_WITH(cpu::bf16_mode_from_env(),
                      "TRIDENT_CPU_BF16=fast: expected staged, native or auto");
  if (old)
    ::setenv("TRIDENT_CPU_BF16", saved.c_str(), 1);
  else
    ::unsetenv("TRIDENT_CPU_BF16");
  if (!cpu::bf16_units().avx512_bf16)
    REQUIRE_THROWS_WITH(cpu::set_bf16_mode(cpu::Bf16Mode::native),
                        Catch::Contains("no AVX512-BF16"));
}

TEST_CASE("the bf16 GEMM equals the fp64 sum of the rounded inputs to fp32 accumulation",
          "[cpu_bf16]") {
  need_bf16_units();
  // one whole 12 x 32 tile; row, column and depth tails; K odd; K past one
  // K block (256) and odd; a row block and a half (288 rows); 1 x 1; K = 1
  constexpr std::array<std::array<int64_t, 3>, 8> shapes = {{{12, 32, 16},
                                                             {13, 33, 7},
                                                             {37, 45, 301},
                                                             {5, 70, 513},
                                                             {288, 40, 64},
                                                             {1, 1, 1},
                                                             {25, 17, 1},
                                                             {64, 96, 256}}};
  for (const auto& s : shapes)
    for (int layout = 0; layout < 4; ++layout)
      for (int f32 = 0; f32 < 4; ++f32)
        check({s[0], s[1], s[2], bool(layout & 1), bool(layout & 2), bool(f32 & 1), bool(f32 & 2),
               0.75f, 0.0f});
  for (float beta : {1.0f, -0.5f}) check({29, 50, 131, false, true, false, false, 1.0f, beta});
  check({29, 50, 131, true, false, true, false, -1.5f, 1.0f});
}

TEST_CASE("K = 0 scales C by beta; M or N = 0 touches nothing", "[cpu_bf16]") {
  need_bf16_units();
  std::vector<float> C = {1.0f, -2.0f, 4.0f, 8.0f};
  const uint16_t one = 0x3f80;
  cpu::gemm_bf16(2, 2, 0, 1.0f, {&one, false, false, 1}, {&one, false, false, 2}, -0.5f, C.data(),
                 2);
  REQUIRE(C == std::vector<float>{-0.5f, 1.0f, -2.0f, -4.0f});
  cpu::gemm_bf16(0, 2, 3, 1.0f, {&one, false, false, 3}, {&one, false, false, 2}, 0.0f, C.data(),
                 2);
  cpu::gemm_bf16(2, 0, 3, 1.0f, {&one, false, false, 3}, {&one, false, false, 1}, 0.0f, C.data(),
                 2);
  REQUIRE(C == std::vector<float>{-0.5f, 1.0f, -2.0f, -4.0f});
}

namespace {

std::vector<float> normals(size_t n, uint64_t key) {
  std::vector<float> x(n);
  rng::fill_normal(x.data(), int64_t(n), key, 0, 1.0f);
  return x;
}

// gemm_bf16_pair against its two gemm_bf16 calls, bit for bit: op(A) shared
// (A [M, K] f32, B_q [N, K] bf16, packed as given or not), or op(B) shared
// (A_q [K, M] bf16 transposed, B [K, N] f32), beta 0 or 1.
void check_pair(int64_t M, int64_t N, int64_t K, bool share_a, int packed, float beta) {
  CAPTURE(M, N, K, share_a, packed, beta);
  const auto a0 = normals(size_t(M * K), 1), a1 = normals(size_t(M * K), 2);
  const auto b0 = rounded(normals(size_t(N * K), 3)), b1 = rounded(normals(size_t(N * K), 4));
  const auto bf = normals(size_t(N * K), 5);
  const auto t0 = rounded(a0), t1 = rounded(a1);
  std::vector<uint32_t> p0(size_t(cpu::bf16_packed_words(N, K))), p1(p0.size());
  cpu::Bf16Operand A[2], B[2];
  for (int q = 0; q < 2; ++q) {
    const auto& b = q == 0 ? b0 : b1;
    A[q] = share_a ? cpu::Bf16Operand{a0.data(), true, false, K}
                   : cpu::Bf16Operand{q == 0 ? t0.data() : t1.data(), false, true, M};
    B[q] = share_a ? cpu::Bf16Operand{b.data(), false, true, K}
                   : cpu::Bf16Operand{bf.data(), true, false, N};
    if (share_a && (packed >> q & 1)) {
      cpu::pack_bf16_b(N, K, B[q], q == 0 ? p0.data() : p1.data());
      B[q].packed = q == 0 ? p0.data() : p1.data();
    }
  }
  std::vector<float> c0 = normals(size_t(M * N), 6), c1 = normals(size_t(M * N), 7);
  std::vector<float> d0 = c0, d1 = c1;
  cpu::gemm_bf16(M, N, K, 0.5f, A[0], B[0], beta, c0.data(), N);
  cpu::gemm_bf16(M, N, K, 0.5f, A[1], B[1], beta, c1.data(), N);
  cpu::gemm_bf16_pair(M, N, K, 0.5f, {{A[0], B[0], d0.data()}, {A[1], B[1], d1.data()}}, beta, N);
  REQUIRE(std::memcmp(c0.data(), d0.data(), c0.size() * 4) == 0);
  REQUIRE(std::memcmp(c1.data(), d1.data(), c1.size() * 4) == 0);
}

}  // namespace

// Its shapes: row and column tails, K odd and past one K block, M past one
// row block (96), op(A) shared with 0, 1 or 2 packed op(B), op(B) shared.
TEST_CASE("the paired bf16 GEMM gives each product's own bits", "[cpu_bf16]") {
  need_bf16_units();
  for (const auto& s : std::vector<std::array<int64_t, 3>>{{13, 33, 7}, {200, 70, 1100}})
    for (const float beta : {0.0f, 1.0f}) {
      for (int packed = 0; packed < 4; ++packed) check_pair(s[0], s[1], s[2], true, packed, beta);
      check_pair(s[0], s[1], s[2], false, 0, beta);
    }
}

TEST_CASE("the bf16 output is the f32 result rounded to nearest even", "[cpu_bf16]") {
  need_bf16_units();
  // one K block (the tiles round as they store) and three (rounded after)
  for (const int64_t K : {77, 1200}) {
    const int64_t M = 19, N = 45;
    const std::vector<uint16_t> A = rounded(randn(size_t(M * K), 4)),
                                B = rounded(randn(size_t(N * K), 5));
    std::vector<float> C(size_t(M * N));
    std::vector<uint16_t> Cb(size_t(M * (N + 3)), 0x1234), packed;  // row stride N + 3
    cpu::gemm_bf16(M, N, K, -0.75f, {A.data(), false, false, K}, {B.data(), false, true, K}, 0.0f,
                   C.data(), N);
    cpu::gemm_bf16_out(M, N, K, -0.75f, {A.data(), false, false, K}, {B.data(), false, true, K},
                       Cb.data(), N + 3);
    for (int64_t i = 0; i < M; ++i) {
      packed.insert(packed.end(), Cb.begin() + i * (N + 3), Cb.begin() + i * (N + 3) + N);
      for (int64_t j = N; j < N + 3; ++j) REQUIRE(Cb[size_t(i * (N + 3) + j)] == 0x1234);
    }
    REQUIRE(packed == rounded(C));
  }
  // round_bf16 (the vector rounding) is to_bf16's, ties, NaN and infinities too
  std::vector<float> x = randn(100, 6);
  x[3] = 1.00390625f;  // 1 + 2^-8: a tie, rounds down to the even 1
  x[4] = 1.01171875f;  // 1 + 3 * 2^-8: a tie, rounds up to the even neighbour
  x[5] = std::nanf("");
  x[6] = -INFINITY;
  x[7] = 3.4e38f;  // past the largest bf16 (3.39e38): rounds to infinity
  std::vector<uint16_t> y(x.size());
  cpu::round_bf16(x.data(), int64_t(x.size()), y.data());
  REQUIRE(y == rounded(x));
  // widen_bf16 (the vector widening) is from_bf16's, bit for bit
  std::vector<float> w(y.size()), ref(y.size());
  cpu::widen_bf16(y.data(), int64_t(y.size()), w.data());
  kernels::cpu::from_bf16(test::kernel_ctx(), y.data(), int64_t(y.size()), ref.data());
  REQUIRE(std::memcmp(w.data(), ref.data(), w.size() * sizeof(float)) == 0);
}

// Round to nearest even on the bit pattern, a NaN made quiet: the rule of
// to_bf16, written out here as the reference of the vector conversions.
uint16_t nearest_even(uint32_t u) {
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return uint16_t((u >> 16) | 0x40u);
  const uint32_t low = u & 0xffffu, high = u >> 16;
  return uint16_t(high + ((low > 0x8000u || (low == 0x8000u && (high & 1u))) ? 1u : 0u));
}

TEST_CASE("the vector bf16 conversions give the scalar rounding's bits for every input",
          "[cpu_bf16]") {
  // every special value: zeros, denormals (vcvtneps2bf16 flushes them), the
  // largest float, infinities, quiet and signalling NaNs with payloads,
  // ties to even up and down, just under and over a tie, a carry into the
  // exponent and into infinity
  const std::vector<uint32_t> special = {
      0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x00008000u,
      0x00018000u, 0x0000ffffu, 0x00400000u, 0x00800000u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,
      0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa5a5a5u,
      0x7fbfffffu, 0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x3fffffffu, 0xbf808000u};
  std::vector<uint32_t> bits(4099);  // random bit patterns: every class of float
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = uint32_t(rng::bits(481, i));
  for (size_t i = 0; i < bits.size(); i += 37) bits[i] = special[(i / 37) % special.size()];
  bits.insert(bits.end(), special.begin(),
              special.end());  // a run of them, some vectors all special
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * sizeof(float));
  std::vector<uint16_t> want(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) want[i] = nearest_even(bits[i]);
  for (const auto how :
       {cpu::Bf16Convert::scalar, cpu::Bf16Convert::avx512, cpu::Bf16Convert::avx512_bf16}) {
    for (const size_t from : {size_t(0), size_t(5), size_t(16)}) {  // every tail and alignment
      CAPTURE(int(how), from);
      const int64_t n = int64_t(x.size() - from);
      std::vector<uint16_t> y(static_cast<size_t>(n));
      cpu::round_bf16_with(how, x.data() + from, n, y.data());
      REQUIRE(y == std::vector<uint16_t>(want.begin() + int64_t(from), want.end()));
      std::vector<float> w(static_cast<size_t>(n));
      cpu::widen_bf16_with(how, y.data(), n, w.data());
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, &w[size_t(i)], sizeof u);
        REQUIRE(u == uint32_t(y[size_t(i)]) << 16);
      }
    }
  }
  std::vector<uint16_t> y(x.size(), 0);  // the ops' to_bf16 too
  kernels::cpu::to_bf16(test::kernel_ctx(), x.data(), int64_t(x.size()), y.data());
  REQUIRE(y == want);
}

TEST_CASE("the native rows agree with the staged rows within bf16 rounding", "[cpu_bf16]") {
  need_bf16_units();
  const auto& ctx = test::kernel_ctx();
  const int64_t T = 40, d = 48, f = 72;
  auto bf16_of = [&](std::vector<int64_t> shape, uint64_t key) {
    return normal_bf16(ctx, std::move(shape), key);
  };
  const Tensor x = bf16_of({T, d}, 7), wg = bf16_of({f, d}, 8), wu = bf16_of({f, d}, 9),
               wd = bf16_of({d, f}, 10);
  auto run = [&](cpu::Bf16Mode mode) {
    cpu::set_bf16_mode(mode);
    Tensor y({T, d}), dx({T, d}), dwg({f, d}), dwu({f, d}), dwd({d, f}), dy({T, d});
    rng::fill_normal(dy.ptr(), dy.numel(), 11, 0, 1.0f);
    for (Tensor* g : {&dwg, &dwu, &dwd}) std::fill_n(g->ptr(), g->numel(), 0.0f);
    Tensor gate = Tensor::empty({T, f}, cpu_allocator(), DType::bf16);
    Tensor up = Tensor::empty({T, f}, cpu_allocator(), DType::bf16);
    kernels::swiglu_forward(ctx, x, wg, wu, wd, y, gate, up);
    kernels::swiglu_backward(ctx, x, gate, up, dy, wg, wu, wd, dx, dwg, dwu, dwd);
    Tensor lin({T, f});
    kernels::linear_forward(ctx, x, wg, lin);
    return std::vector<Tensor>{y, dx, dwg, dwu, dwd, lin};
  };
  const auto staged = run(cpu::Bf16Mode::staged), native = run(cpu::Bf16Mode::native);
  cpu::set_bf16_mode(cpu::Bf16Mode::automatic);
  for (size_t t = 0; t < staged.size(); ++t) {
    INFO("output " << t << " (y, dx, dw_gate, dw_up, dw_down, linear y)");
    double err = 0, scale = 0;
    for (int64_t i = 0; i < staged[t].numel(); ++i) {
      err = std::max(err, double(std::fabs(staged[t].ptr()[i] - native[t].ptr()[i])));
      scale = std::max(scale, double(std::fabs(staged[t].ptr()[i])));
    }
    // the native GEMM rounds h, dh and dy to bf16 (one rounding, 2^-9
    // relative each), the staged row keeps them f32
    REQUIRE(err <= 2e-2 * scale);
    if (t == 5) REQUIRE(err <= 1e-5 * scale);  // both bf16 x bf16: only the order differs
  }
}

TEST_CASE("the native gather into bf16 rows gives the staged row's bits", "[cpu_bf16]") {
  need_bf16_units();
  const auto& ctx = test::kernel_ctx();
  const int64_t T = 9, d = 37, n = 14;  // d: two vectors and a tail
  Tensor x({T, d});
  rng::fill_normal(x.ptr(), x.numel(), 21, 0, 3.0f);
  x.ptr()[3] = -0.0f;
  x.ptr()[5] = std::numeric_limits<float>::infinity();
  std::vector<int64_t> src(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) src[size_t(i)] = (i * 5 + 2) % T;
  const Tensor index = kernels::from_host(ctx, src.data(), {n}, DType::i64);
  auto run = [&](cpu::Bf16Mode mode) {
    cpu::set_bf16_mode(mode);
    Tensor out = Tensor::empty({n, d}, cpu_allocator(), DType::bf16);
    kernels::gather_rows(ctx, x, index, out);
    const uint16_t* p = out.data<uint16_t>();
    return std::vector<uint16_t>(p, p + out.numel());
  };
  const auto staged = run(cpu::Bf16Mode::staged), native = run(cpu::Bf16Mode::native);
  cpu::set_bf16_mode(cpu::Bf16Mode::automatic);
  std::vector<uint16_t> want(size_t(n * d));
  for (int64_t i = 0; i < n; ++i)
    cpu::to_bf16(ctx, x.ptr() + src[size_t(i)] * d, d, want.data() + i * d);
  REQUIRE(staged == want);
  REQUIRE(native == want);
}

namespace {

// The SwiGLU's forward and backward and a linear layer's two GEMMs on the
// weights w (gate, up, down) with their packed forms pk (null: none), x and
// the gradients drawn by key: y, dx, dw_gate, dw_up, dw_down, linear y,
// linear dx.
std::vector<Tensor> run_ffn(const Tensor& x, const std::array<Tensor, 3>& w,
                            const kernels::SwigluPacked& pk) {
  const auto& ctx = test::kernel_ctx();
  const int64_t T = x.dim(0), f = w[0].dim(0), d = w[0].dim(1);
  Tensor y({T, d}), dx({T, d}), dwg({f, d}), dwu({f, d}), dwd({d, f}), dy({T, d});
  rng::fill_normal(dy.ptr(), dy.numel(), 21, 0, 1.0f);
  for (Tensor* g : {&dwg, &dwu, &dwd}) std::fill_n(g->ptr(), g->numel(), 0.0f);
  Tensor gate = Tensor::empty({T, f}, cpu_allocator(), DType::bf16);
  Tensor up = Tensor::empty({T, f}, cpu_allocator(), DType::bf16);
  kernels::swiglu_forward(ctx, x, w[0], w[1], w[2], y, gate, up, pk);
  kernels::swiglu_backward(ctx, x, gate, up, dy, w[0], w[1], w[2], dx, dwg, dwu, dwd, pk);
  Tensor lin({T, f}), lin_dx({T, d}), dlin({T, f});
  rng::fill_normal(dlin.ptr(), dlin.numel(), 22, 0, 1.0f);
  kernels::linear_forward(ctx, x, w[0], lin, pk.w_gate);
  kernels::linear_backward_input(ctx, dlin, w[0], lin_dx, 0.0f, pk.w_gate);
  return {y, dx, dwg, dwu, dwd, lin, lin_dx};
}

// Each weight of w packed (refreshed), and the three as a SwiGLU takes them.
struct Packs {
  std::vector<std::unique_ptr<kernels::PackedBf16Weight>> w;
  kernels::SwigluPacked swiglu() const { return {w[0].get(), w[1].get(), w[2].get()}; }
};
Packs packs_of(const std::array<Tensor, 3>& w) {
  Packs p;
  for (const Tensor& t : w) {
    p.w.push_back(std::make_unique<kernels::PackedBf16Weight>(test::kernel_ctx(), t));
    REQUIRE(p.w.back()->has_forms());
    REQUIRE(p.w.back()->bytes() == kernels::gemm_bf16_packed_weight_bytes(t.dim(0), t.dim(1)));
    p.w.back()->refresh();
  }
  return p;
}

void require_same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t t = 0; t < a.size(); ++t) {
    INFO("output " << t << " (y, dx, dw_gate, dw_up, dw_down, linear y, linear dx)");
    REQUIRE(std::memcmp(a[t].ptr(), b[t].ptr(), a[t].bytes()) == 0);
  }
}

}  // namespace

TEST_CASE("the packed weight operand gives the per-call packing's bits", "[cpu_bf16]") {
  need_bf16_units();
  const auto& ctx = test::kernel_ctx();
  cpu::set_bf16_mode(cpu::Bf16Mode::native);
  // f odd and past a K block (w_down's forward, w_gate's dx), d not a multiple of 32
  const int64_t T = 21, d = 48, f = 1031;
  const Tensor x = normal_bf16(ctx, {T, d}, 17);
  // fp32 masters and their bf16 copies (kernels::convert's rounding)
  std::array<Tensor, 3> master{Tensor({f, d}), Tensor({f, d}), Tensor({d, f})}, copy;
  for (size_t i = 0; i < 3; ++i) {
    rng::fill_normal(master[i].ptr(), master[i].numel(), 18 + i, 0, 1.0f);
    copy[i] = Tensor::empty(master[i].shape(), cpu_allocator(), DType::bf16);
    kernels::convert(ctx, master[i], copy[i]);
  }
  const auto plain = run_ffn(x, copy, {});
  Packs of_copy = packs_of(copy), of_master = packs_of(master);
  // the copies packed, and the masters packed (rounded as they are packed): the same words
  require_same_bits(plain, run_ffn(x, copy, of_copy.swiglu()));
  require_same_bits(plain, run_ffn(x, master, of_master.swiglu()));
  // the rows read the packed form: a master written without refresh() keeps its old product
  std::fill_n(master[0].ptr(), master[0].numel(), 0.0f);
  require_same_bits(plain, run_ffn(x, master, of_master.swiglu()));
  of_master.w[0]->refresh();
  Tensor lin({T, f});
  kernels::linear_forward(ctx, x, master[0], lin, of_master.w[0].get());
  for (int64_t i = 0; i < lin.numel(); ++i) REQUIRE(lin.ptr()[i] == 0.0f);
  // the staged row with the packed masters rounds them first: its bits on the copies
  rng::fill_normal(master[0].ptr(), master[0].numel(), 18, 0, 1.0f);
  of_master.w[0]->refresh();
  cpu::set_bf16_mode(cpu::Bf16Mode::staged);
  require_same_bits(run_ffn(x, copy, {}), run_ffn(x, master, of_master.swiglu()));
  cpu::set_bf16_mode(cpu::Bf16Mode::automatic);
}

namespace {

struct AttnRun {
  Tensor out, lse;
};

// The attention of shape s on q, k, v (bf16 tensors, or their f32 widening)
// under `mode` (the f32 inputs ignore it).
AttnRun run_attention(const kernels::AttnShape& s, const std::vector<Tensor>& qkv,
                      cpu::Bf16Mode mode) {
  const auto& ctx = test::kernel_ctx();
  cpu::set_bf16_mode(mode);
  AttnRun r{Tensor::empty({s.Tq, s.H, s.D}, cpu_allocator(), qkv[0].dtype()),
            Tensor({s.Tq, int64_t(s.H)})};
  kernels::attention_forward(ctx, s, qkv[0], qkv[1], qkv[2], r.out, r.lse);
  cpu::set_bf16_mode(cpu::Bf16Mode::automatic);
  return r;
}

// x (bf16) widened to f32.
Tensor widened(const Tensor& x) {
  Tensor y(x.shape());
  kernels::convert(test::kernel_ctx(), x, y);
  return y;
}

struct AttnCase {
  int64_t Tq, Tk;
  int H, Hkv, D;
  bool causal;
  int64_t window = 0;  // > 0: a sliding window
  int64_t doc = 0;     // > 0: a new document every `doc` positions
  int64_t q_pos0 = 0, k_pos0 = 0;
};

// Odd lengths, one and several query blocks and key tiles, GQA, causal and
// full; a window; documents; queries after their keys (a ring step) and
// queries that see no key (keys after them: lse -inf); head_dim 128 over
// more keys than one chunk of the forward; strips whose first and last
// keys fall at every offset of the 16- and 32-key panels (queries 37 to 40
// positions after their keys, causal, and with a window of 5, where a key
// dropped is a fifth of a row): the kernels skip the halves of a panel, the
// key pairs and the row pairs that no row of a strip sees, and would drop
// a visible key there.
std::vector<AttnCase> attention_cases() {
  std::vector<AttnCase> cases{AttnCase{77, 77, 2, 1, 24, true},
                              AttnCase{77, 77, 2, 2, 24, false},
                              AttnCase{601, 601, 4, 2, 40, true},
                              AttnCase{301, 555, 2, 1, 33, false},
                              AttnCase{333, 333, 4, 2, 32, true, 100},
                              AttnCase{400, 400, 2, 1, 64, true, 0, 97},
                              AttnCase{100, 300, 2, 1, 32, true, 0, 0, 200, 0},
                              AttnCase{120, 200, 2, 2, 32, true, 0, 0, 0, 50},
                              AttnCase{130, 700, 2, 1, 128, false},
                              AttnCase{45, 93, 1, 1, 32, true, 0, 0, 37, 0}};
  for (int64_t off = 0; off < 4; ++off)
    cases.push_back(AttnCase{200, 240, 1, 1, 32, true, 5, 0, 37 + off, 0});
  return cases;
}

// The document ids of a case's queries and keys, kept for its shape.
struct AttnDocs {
  std::vector<int32_t> q, k;
};

kernels::AttnShape attn_shape(const AttnCase& c, AttnDocs& docs) {
  kernels::AttnShape s;
  s.Tq = c.Tq, s.Tk = c.Tk, s.H = c.H, s.Hkv = c.Hkv, s.D = c.D, s.causal = c.causal;
  s.scale = 1.0f / std::sqrt(float(c.D));
  s.window = c.window, s.q_pos0 = c.q_pos0, s.k_pos0 = c.k_pos0;
  if (c.doc > 0) {
    for (int64_t i = 0; i < c.Tq; ++i) docs.q.push_back(int32_t((c.q_pos0 + i) / c.doc));
    for (int64_t j = 0; j < c.Tk; ++j) docs.k.push_back(int32_t((c.k_pos0 + j) / c.doc));
    s.q_doc = docs.q.data(), s.k_doc = docs.k.data();
  }
  return s;
}

// q, k and v of shape s rounded to bf16 (bf), and those widened to f32 (wide).
struct AttnInputs {
  std::vector<Tensor> bf, wide;
};
AttnInputs attn_inputs(const kernels::AttnShape& s) {
  AttnInputs in;
  for (int t = 0; t < 3; ++t) {
    const int64_t T = t == 0 ? s.Tq : s.Tk, heads = t == 0 ? s.H : s.Hkv;
    Tensor x({T, heads, int64_t(s.D)});
    rng::fill_normal(x.ptr(), x.numel(), 40 + uint64_t(t), 0, 2.0f);
    in.bf.push_back(Tensor::empty(x.shape(), cpu_allocator(), DType::bf16));
    kernels::convert(test::kernel_ctx(), x, in.bf.back());
    in.wide.push_back(widened(in.bf.back()));
  }
  return in;
}

// dq, dk, dv (f32, from zero) of the attention of shape s under `mode`.
std::vector<Tensor> attn_grads(const kernels::AttnShape& s, const std::vector<Tensor>& qkv,
                               const Tensor& out, const Tensor& lse, const Tensor& dout,
                               cpu::Bf16Mode mode) {
  cpu::set_bf16_mode(mode);
  std::vector<Tensor> g{Tensor(qkv[0].shape()), Tensor(qkv[1].shape()), Tensor(qkv[2].shape())};
  kernels::attention_backward(test::kernel_ctx(), s, qkv[0], qkv[1], qkv[2], out, lse, dout, g[0],
                              g[1], g[2]);
  cpu::set_bf16_mode(cpu::Bf16Mode::automatic);
  return g;
}

}  // namespace

#ifdef TRIDENT_ATTN_BF16
// The native attention's exponential (attn16::exp2_fast, P = 2^(s - m) in
// log2 units) against the fp64 2^x: within 3e-6 relative (its polynomial
// 2.6e-6, then fp32; bf16's P is 2^-9) on a fine grid of [-126, 1] and at both sides of every
// integer (where its reduction switches), tails of vectors included; 0
// (never a denormal) below -126, for very negative inputs and for the -inf
// of a masked score; NaN kept.
TEST_CASE("the native attention's exp2 over its whole input range", "[cpu_bf16]") {
  need_bf16_units();
  std::vector<float> x;
  for (int i = 0; i <= 127 * 4096; ++i) x.push_back(-126.0f + float(i) / 4096.0f);
  for (int n = -126; n <= 1; ++n)
    for (const float d : {-1e-6f, -1e-7f, 0.0f, 1e-7f, 1e-6f}) x.push_back(float(n) + d);
  x.push_back(0.0f), x.push_back(-0.0f), x.push_back(1e-30f), x.push_back(-1e-30f);
  const size_t live = x.size();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const float v : {-126.001f, -127.0f, -149.5f, -200.0f, -1e6f, -1e30f, -3.4e38f, -kInf})
    x.push_back(v);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  std::vector<float> y(x.size(), 7.0f);
  cpu::attn16::exp2_fast_rows(x.data(), y.data(), int64_t(x.size()));
  double worst = 0;
  size_t not_normal = 0;
  for (size_t i = 0; i < live; ++i) {
    const double ref = std::exp2(double(x[i]));
    worst = std::max(worst, std::fabs(double(y[i]) - ref) / ref);
    not_normal += std::fpclassify(y[i]) != FP_NORMAL;
  }
  CAPTURE(worst, not_normal);
  REQUIRE(worst <= 3e-6);
  REQUIRE(not_normal == 0);
  for (size_t i = live; i + 1 < x.size(); ++i) {
    INFO("x " << x[i]);
    REQUIRE(y[i] == 0.0f);
  }
  REQUIRE(std::isnan(y.back()));
}
#endif

// The native SwiGLU's gating (gated_fast, gated_backward_fast: the sigmoid on
// exp2_fast) against the f32 passes (libmvec's expf) on the same inputs:
// h within 1e-5 relative, d(gate) within 1e-5 |g u| (1 + |a|) (its factor
// 1 + a (1 - s) crosses 0), d(up) within 1e-5 relative; saturating inputs
// (|a| up to 100: e^-a below 2^-126 or past fp32) give the same values;
// every length's tail lanes, nothing written past n.
TEST_CASE("the native SwiGLU gating agrees with the f32 gating", "[cpu_bf16]") {
  need_bf16_units();
  for (const size_t n : {size_t(1), size_t(15), size_t(16), size_t(17), size_t(1037)}) {
    std::vector<float> a(n), u(n), g(n);
    for (size_t i = 0; i < n; ++i)
      a[i] = rng::uniform(4807, i) * 24.0f - 12.0f, u[i] = rng::normal(4808, i),
      g[i] = rng::normal(4809, i);
    const float edge[] = {-100.0f, -50.0f, -1.2785f, 0.0f, 50.0f, 100.0f};
    for (size_t i = 0; i < std::size(edge) && i < n; ++i) a[n - 1 - i] = edge[i];
    std::vector<float> h(n), hf(n + 1, 7.0f), dg(n), dgf(n + 1, 7.0f), du = g, duf = g;
    duf.push_back(7.0f);
    cpu::gated(a.data(), u.data(), h.data(), n);
    cpu::gated_fast(a.data(), u.data(), hf.data(), n);
    cpu::gated_backward(a.data(), u.data(), du.data(), dg.data(), n);
    cpu::gated_backward_fast(a.data(), u.data(), duf.data(), dgf.data(), n);
    for (size_t i = 0; i < n; ++i) {
      INFO("n " << n << " a " << a[i]);
      REQUIRE(std::fabs(hf[i] - h[i]) <= 1e-5f * std::fabs(h[i]));
      REQUIRE(std::fabs(duf[i] - du[i]) <= 1e-5f * std::fabs(du[i]));
      REQUIRE(std::fabs(dgf[i] - dg[i]) <= 1e-5f * std::fabs(g[i] * u[i]) * (1 + std::fabs(a[i])));
    }
    REQUIRE((hf[n] == 7.0f && dgf[n] == 7.0f && duf[n] == 7.0f));
  }
}

// Native attention against the fp32 kernel on the same bf16-rounded inputs:
// the products of two bf16 values are exact in fp32, so S differs only in
// its summation order; P rounded to bf16 (2^-9 relative) moves each output
// by at most 2^-9 max|v| and both outputs are rounded to bf16 once (2^-9
// |out| each): |native - fp32| <= 4 * 2^-9 max|v|, lse within 1e-4. The
// staged row is the fp32 kernel's output rounded, bit for bit.
TEST_CASE("native bf16 attention agrees with the fp32 attention of the rounded inputs",
          "[cpu_bf16]") {
  need_bf16_units();
  for (const AttnCase& sh : attention_cases()) {
    AttnDocs docs;
    const kernels::AttnShape s = attn_shape(sh, docs);
    INFO("Tq " << s.Tq << " Tk " << s.Tk << " H " << s.H << "/" << s.Hkv << " D " << s.D
               << (s.causal ? " causal" : " full") << " window " << s.window << " doc " << sh.doc
               << " q_pos0 " << s.q_pos0 << " k_pos0 " << s.k_pos0);
    const AttnInputs in = attn_inputs(s);
    const std::vector<Tensor>& bf = in.bf;
    const std::vector<Tensor>& wide = in.wide;
    const AttnRun ref = run_attention(s, wide, cpu::Bf16Mode::staged);
    const AttnRun native = run_attention(s, bf, cpu::Bf16Mode::native);
    const AttnRun staged = run_attention(s, bf, cpu::Bf16Mode::staged);
    const Tensor out = widened(native.out);
    const std::vector<uint16_t> ref_bits =
        rounded(std::vector<float>(ref.out.ptr(), ref.out.ptr() + ref.out.numel()));
    double vmax = 0, err = 0, lse_err = 0;
    for (int64_t i = 0; i < wide[2].numel(); ++i)
      vmax = std::max(vmax, double(std::fabs(wide[2].ptr()[i])));
    for (int64_t i = 0; i < out.numel(); ++i) {
      err = std::max(err, double(std::fabs(out.ptr()[i] - ref.out.ptr()[i])));
      REQUIRE(staged.out.data<uint16_t>()[i] == ref_bits[size_t(i)]);
    }
    for (int64_t i = 0; i < ref.lse.numel(); ++i) {
      lse_err = std::max(lse_err, double(std::fabs(native.lse.ptr()[i] - ref.lse.ptr()[i])));
      REQUIRE(staged.lse.ptr()[i] == ref.lse.ptr()[i]);
    }
    CAPTURE(err, vmax, lse_err);
    REQUIRE(err <= 4.0 * std::ldexp(1.0, -9) * vmax);
    REQUIRE(lse_err <= 1e-4);
    REQUIRE(err > 0.0);  // the native row ran (P rounded): not the staged bits
  }
}

// The native backward against the fp32 kernel's on the same bf16-rounded
// q, k, v, out and dout (and the same lse): P and dS rounded to bf16 as the
// GEMMs pack them (2^-9 relative each) put dq, dk and dv within 1e-2 of the
// fp32 gradients in relative norm (measured on Zen 4: below 3e-3); the staged
// row is the fp32 kernel on the widened inputs, bit for bit.
TEST_CASE("native bf16 attention backward agrees with the fp32 backward", "[cpu_bf16]") {
  need_bf16_units();
  const auto& ctx = test::kernel_ctx();
  for (const AttnCase& sh : attention_cases()) {
    AttnDocs docs;
    const kernels::AttnShape s = attn_shape(sh, docs);
    INFO("Tq " << s.Tq << " Tk " << s.Tk << " H " << s.H << "/" << s.Hkv << " D " << s.D
               << (s.causal ? " causal" : " full") << " window " << s.window << " doc " << sh.doc
               << " q_pos0 " << s.q_pos0 << " k_pos0 " << s.k_pos0);
    const AttnInputs in = attn_inputs(s);
    const AttnRun fwd = run_attention(s, in.wide, cpu::Bf16Mode::staged);
    Tensor out_bf = Tensor::empty(fwd.out.shape(), cpu_allocator(), DType::bf16);
    kernels::convert(ctx, fwd.out, out_bf);
    Tensor dout({s.Tq, int64_t(s.H), int64_t(s.D)});
    rng::fill_normal(dout.ptr(), dout.numel(), 50, 0, 1.0f);
    Tensor dout_bf = Tensor::empty(dout.shape(), cpu_allocator(), DType::bf16);
    kernels::convert(ctx, dout, dout_bf);
    const std::vector<Tensor> ref =
        attn_grads(s, in.wide, widened(out_bf), fwd.lse, widened(dout_bf), cpu::Bf16Mode::staged);
    const std::vector<Tensor> native =
        attn_grads(s, in.bf, out_bf, fwd.lse, dout_bf, cpu::Bf16Mode::native);
    const std::vector<Tensor> staged =
        attn_grads(s, in.bf, out_bf, fwd.lse, dout_bf, cpu::Bf16Mode::staged);
    for (size_t t = 0; t < 3; ++t) {
      INFO("gradient " << t << " (dq, dk, dv)");
      double err = 0, norm = 0;
      for (int64_t i = 0; i < ref[t].numel(); ++i) {
        const double r = ref[t].ptr()[i];
        err += (native[t].ptr()[i] - r) * (native[t].ptr()[i] - r);
        norm += r * r;
        REQUIRE(staged[t].ptr()[i] == ref[t].ptr()[i]);
      }
      CAPTURE(std::sqrt(err / norm));
      REQUIRE(std::sqrt(err) <= 1e-2 * std::sqrt(norm));
      REQUIRE(err > 0.0);  // the native row ran
    }
  }
}

namespace {

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Best of `reps` CPU times of fn, after one warm-up call.
template <class Fn>
double best_seconds(int reps, Fn fn) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_seconds();
    fn();
    best = std::min(best, cpu_seconds() - t0);
  }
  return best;
}

}  // namespace

// Not a test (hidden: run it by name, pinned, one BLAS thread):
//   OPENBLAS_NUM_THREADS=1 taskset -c 1 build/test_cpu_bf16 '[.bench]'
// The native bf16 GEMM's rate on the dense benchmark model's shapes (T =
// 1024 tokens of a micro-batch, d 256, ffn 1024) and at 2048^3, against
// sgemm (OpenBLAS) on the same shapes and operands in f32, by CPU time.
TEST_CASE("bf16 GEMM rate against sgemm", "[.bench]") {
  need_bf16_units();
  struct Shape {
    const char* name;
    int64_t M, N, K;
    bool ta, tb, a_f32;
  };
  const Shape shapes[] = {{"forward x Wg^T (T, ffn, d)", 1024, 1024, 256, false, true, false},
                          {"forward h Wd^T (T, d, ffn)", 1024, 256, 1024, false, true, true},
                          {"input grad dy Wd (T, ffn, d)", 1024, 1024, 256, false, false, true},
                          {"weight grad dy^T x (ffn, d, T)", 1024, 256, 1024, true, false, true},
                          {"q projection (T, d, d)", 1024, 256, 256, false, true, false},
                          {"2048^3", 2048, 2048, 2048, false, true, false}};
  std::printf(
      "| shape | M | N | K | bf16 GFLOP/s | sgemm GFLOP/s | bf16 / sgemm "
      "|\n|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    const std::vector<float> A = randn(size_t(s.M * s.K), 1), B = randn(size_t(s.K * s.N), 2);
    const std::vector<uint16_t> Ab = rounded(A), Bb = rounded(B);
    std::vector<float> C(size_t(s.M * s.N));
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    const cpu::Bf16Operand a{s.a_f32 ? static_cast<const void*>(A.data()) : Ab.data(), s.a_f32,
                             s.ta, lda};
    const cpu::Bf16Operand b{Bb.data(), false, s.tb, ldb};
    const double t_bf16 =
        best_seconds(5, [&] { cpu::gemm_bf16(s.M, s.N, s.K, 1.0f, a, b, 0.0f, C.data(), s.N); });
    const double t_f32 = best_seconds(5, [&] {
      kernels::cpu::sgemm(test::kernel_ctx(), s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda,
                          B.data(), ldb, 0.0f, C.data(), s.N);
    });
    const double flop = 2.0 * double(s.M) * double(s.N) * double(s.K);
    std::printf("| %s | %lld | %lld | %lld | %.1f | %.1f | %.2f |\n", s.name, (long long)s.M,
                (long long)s.N, (long long)s.K, flop / t_bf16 / 1e9, flop / t_f32 / 1e9,
                t_f32 / t_bf16);
  }
  SUCCEED();
}

namespace {

// The best CPU times (ms) of the forward and of the backward of shape s,
// the fp32 kernel on f32 tensors (v = 0) and the native bf16 kernel on bf16
// ones (v = 1), over `rounds` rounds that alternate the two.
void attention_times(const kernels::AttnShape& s, int rounds, double (&ms)[2][2]) {
  const AttnInputs in = attn_inputs(s);
  std::vector<AttnRun> fwd;
  std::vector<Tensor> dout;
  for (int v = 0; v < 2; ++v) {  // the outputs and dO the backward reads, and a warm-up
    const std::vector<Tensor>& qkv = v == 0 ? in.wide : in.bf;
    fwd.push_back(run_attention(s, qkv, v == 0 ? cpu::Bf16Mode::staged : cpu::Bf16Mode::native));
    dout.push_back(Tensor::empty(fwd[size_t(v)].out.shape(), cpu_allocator(), qkv[0].dtype()));
    kernels::convert(test::kernel_ctx(), fwd[size_t(v)].out, dout.back());
    ms[v][0] = ms[v][1] = 1e30;
  }
  for (int r = 0; r < rounds; ++r)
    for (int v = 0; v < 2; ++v) {
      const std::vector<Tensor>& qkv = v == 0 ? in.wide : in.bf;
      const cpu::Bf16Mode mode = v == 0 ? cpu::Bf16Mode::staged : cpu::Bf16Mode::native;
      const AttnRun& f = fwd[size_t(v)];
      double t0 = cpu_seconds();
      run_attention(s, qkv, mode);
      ms[v][0] = std::min(ms[v][0], 1e3 * (cpu_seconds() - t0));
      t0 = cpu_seconds();
      attn_grads(s, qkv, f.out, f.lse, dout[size_t(v)], mode);
      ms[v][1] = std::min(ms[v][1], 1e3 * (cpu_seconds() - t0));
    }
}

}  // namespace

// Not a test (hidden, as above): the attention's forward and forward +
// backward per call, the fp32 kernel on f32 tensors against the native bf16
// kernel on bf16 ones, by CPU time, best of TRIDENT_BENCH_ROUNDS (default
// 7) rounds that alternate the two: the dense benchmark model's shape (one
// micro-batch: 512 tokens, 8 heads over 4 kv heads, head_dim 32, causal),
// head_dim 64 and 128, and the first full.
TEST_CASE("bf16 attention rate against the fp32 attention", "[.bench]") {
  need_bf16_units();
  const char* env = std::getenv("TRIDENT_BENCH_ROUNDS");
  const int rounds = env ? std::max(1, std::atoi(env)) : 7;
  std::printf(
      "| shape | fwd fp32 (ms) | fwd bf16 (ms) | fwd+bwd fp32 (ms) | fwd+bwd bf16 (ms) | fwd "
      "fp32/bf16 | fwd+bwd fp32/bf16 |\n|---|---|---|---|---|---|---|\n");
  for (const AttnCase& c :
       {AttnCase{512, 512, 8, 4, 32, true}, AttnCase{512, 512, 4, 4, 64, true},
        AttnCase{2048, 2048, 1, 1, 128, true}, AttnCase{512, 512, 8, 4, 32, false}}) {
    AttnDocs docs;
    const kernels::AttnShape s = attn_shape(c, docs);
    double ms[2][2];
    attention_times(s, rounds, ms);
    const double fb[2] = {ms[0][0] + ms[0][1], ms[1][0] + ms[1][1]};
    std::printf("| T %lld, H %d/%d, D %d%s | %.2f | %.2f | %.2f | %.2f | %.2fx | %.2fx |\n",
                (long long)s.Tq, s.H, s.Hkv, s.D, s.causal ? ", causal" : ", full", ms[0][0],
                ms[1][0], fb[0], fb[1], ms[0][0] / ms[1][0], fb[0] / fb[1]);
  }
  SUCCEED();
}
