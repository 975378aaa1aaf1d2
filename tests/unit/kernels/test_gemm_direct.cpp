// gemm_direct (kernels/cpu/gemm_direct.hpp, the attention's GEMM) against a
// plain fp64 triple loop on random inputs: both layouts of A, beta 0, 1, -0.5,
// alpha != 1, shapes with row, column and depth tails, row strides wider
// than the rows, and nothing written outside C's block. B in panels (the
// layout, and bit-identity with gemm_direct), gemm_direct_rows and the native
// softmax row passes against the same product and std::exp.
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "gemm_direct.hpp"
#include "kernel_ctx.hpp"
#include "random.hpp"
#include "trident/core/rng.hpp"

using namespace trident;
using trident::testing::randn;

namespace {

// The shapes (M, N, K) of the panel and row-pass tests: 1 x 1, one whole
// 8 x 32 tile, row, column and depth tails, an attention tile, K = 0.
constexpr std::array<std::array<int64_t, 3>, 6> kPanelShapes = {
    {{1, 1, 1}, {8, 32, 16}, {13, 70, 37}, {256, 512, 128}, {33, 17, 64}, {7, 5, 0}}};

// Columns [0, cols) of the K-row operand B (row stride ldb) in panels of
// `stride` floats (pack_panels' layout).
std::vector<float> panels_of(const std::vector<float>& B, int64_t ldb, int64_t K, int64_t cols,
                             int64_t stride) {
  namespace cpu = kernels::cpu;
  std::vector<float> bp(size_t((cols + cpu::kPanel - 1) / cpu::kPanel * stride));
  cpu::pack_panels(B.data(), ldb, K, cols, bp.data(), stride);
  return bp;
}

}  // namespace

TEST_CASE("gemm_direct equals the fp64 product on random inputs", "[gemm_direct]") {
  INFO("native AVX-512 kernel on this machine: " << kernels::cpu::gemm_direct_native());
  const float sentinel = 12345.0f;
  uint64_t key = 9100;
  for (bool a_trans : {false, true})
    for (float beta : {0.0f, 1.0f, -0.5f})
      for (auto [M, N, K] : {std::array<int64_t, 3>{1, 1, 1},
                             {8, 32, 16},
                             {13, 70, 37},
                             {256, 512, 128},
                             {33, 17, 512},
                             {7, 5, 0},
                             {40, 128, 3}}) {
        INFO("a_trans " << a_trans << " beta " << beta << " M " << M << " N " << N << " K " << K);
        const float alpha = 0.37f;
        // row strides wider than the rows, so that reading or writing past
        // a row's end would be seen
        const int64_t lda = (a_trans ? M : K) + 3, ldb = N + 5, ldc = N + 7;
        auto A = randn(size_t((a_trans ? K : M) * lda), ++key);
        auto B = randn(size_t(K * ldb + 1), ++key);
        auto C = randn(size_t(M * ldc), ++key);
        const std::vector<float> C0 = C;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = N; j < ldc; ++j) C[size_t(i * ldc + j)] = sentinel;
        kernels::cpu::gemm_direct(test::kernel_ctx(), a_trans, M, N, K, alpha, A.data(), lda,
                                  B.data(), ldb, beta, C.data(), ldc);
        double worst = 0.0;
        int64_t outside = 0;
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) {
            double ref = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; ++k) {
              const double a = a_trans ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)];
              ref += a * double(B[size_t(k * ldb + j)]);
              mag += std::fabs(a * double(B[size_t(k * ldb + j)]));
            }
            const double c0 = beta != 0.0f ? double(beta) * C0[size_t(i * ldc + j)] : 0.0;
            ref = alpha * ref + c0;
            mag = alpha * mag + std::fabs(c0);
            // fp32 products summed in one chain of K steps: error < K ulp of the magnitude
            const double err = std::fabs(double(C[size_t(i * ldc + j)]) - ref) /
                               (std::max(mag, 1e-30) * double(K + 2));
            worst = std::max(worst, err);
          }
          for (int64_t j = N; j < ldc; ++j) outside += C[size_t(i * ldc + j)] != sentinel;
        }
        CHECK(worst <= 1.2e-7);  // 2^-23 per step of the chain
        CHECK(outside == 0);
      }
}

TEST_CASE("transpose_rows writes the transpose and nothing else", "[gemm_direct]") {
  const float sentinel = -777.0f;
  uint64_t key = 9300;
  for (auto [rows, cols] :
       {std::array<int64_t, 2>{1, 1}, {16, 16}, {17, 33}, {5, 128}, {513, 32}, {40, 7}, {0, 9}}) {
    INFO("rows " << rows << " cols " << cols);
    const int64_t ld = cols + 3, ldt = rows + 5;
    const auto x = randn(size_t(std::max<int64_t>(rows, 1) * ld), ++key);
    std::vector<float> xt(size_t(cols * ldt), sentinel);
    kernels::cpu::transpose_rows(x.data(), ld, rows, cols, xt.data(), ldt);
    int64_t wrong = 0, outside = 0;
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) wrong += xt[size_t(c * ldt + r)] != x[size_t(r * ld + c)];
      for (int64_t r = rows; r < ldt; ++r) outside += xt[size_t(c * ldt + r)] != sentinel;
    }
    CHECK(wrong == 0);
    CHECK(outside == 0);
  }
}

TEST_CASE("pack_panels and transpose_panels put each element where PanelB reads it",
          "[gemm_direct]") {
  namespace cpu = kernels::cpu;
  const float sentinel = -555.0f;
  uint64_t key = 9400;
  for (auto [rows, cols] :
       {std::array<int64_t, 2>{1, 1}, {32, 32}, {17, 33}, {5, 128}, {70, 72}, {40, 7}, {0, 9}}) {
    INFO("rows " << rows << " cols " << cols);
    const int64_t ld = cols + 3;
    const auto x = randn(size_t(std::max<int64_t>(rows, 1) * ld), ++key);
    // pack_panels: element (r, c) at panel c / kPanel, row r, lane c % kPanel
    const int64_t stride = rows * cpu::kPanel + 5;
    const int64_t n_panels = (cols + cpu::kPanel - 1) / cpu::kPanel;
    std::vector<float> xp(size_t(n_panels * stride), sentinel);
    cpu::pack_panels(x.data(), ld, rows, cols, xp.data(), stride);
    int64_t wrong = 0, written = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        wrong += xp[size_t((c / cpu::kPanel) * stride + r * cpu::kPanel + c % cpu::kPanel)] !=
                 x[size_t(r * ld + c)];
    for (float v : xp) written += v != sentinel;
    CHECK(wrong == 0);
    CHECK(written == rows * cols);             // nothing else
    if (!cpu::gemm_direct_native()) continue;  // transpose_panels is native only
    // transpose_panels: element (c, r) of x's transpose at panel r / kPanel
    const int64_t tstride = cols * cpu::kPanel + 3;
    const int64_t t_panels = (rows + cpu::kPanel - 1) / cpu::kPanel;
    std::vector<float> tp(size_t(std::max<int64_t>(t_panels, 1) * tstride), sentinel);
    cpu::transpose_panels(x.data(), ld, rows, cols, tp.data(), tstride);
    wrong = written = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        wrong += tp[size_t((r / cpu::kPanel) * tstride + c * cpu::kPanel + r % cpu::kPanel)] !=
                 x[size_t(r * ld + c)];
    for (float v : tp) written += v != sentinel;
    CHECK(wrong == 0);
    CHECK(written == rows * cols);
  }
}

TEST_CASE("gemm_direct with B in panels equals gemm_direct bit for bit", "[gemm_direct]") {
  namespace cpu = kernels::cpu;
  if (!cpu::gemm_direct_native()) {
    WARN("SKIP: gemm_direct_panels needs AVX-512F and FMA, which this machine lacks");
    return;
  }
  const float sentinel = 2121.0f;
  uint64_t key = 9600;
  for (bool a_trans : {false, true})
    for (float beta : {0.0f, 1.0f, -0.5f})
      for (int64_t col0 : {0, 5, 17, 32})
        for (auto [M, N, K] : kPanelShapes) {
          INFO("a_trans " << a_trans << " beta " << beta << " col0 " << col0 << " M " << M << " N "
                          << N << " K " << K);
          const float alpha = 0.37f;
          const int64_t lda = (a_trans ? M : K) + 3, ldb = col0 + N + 5, ldc = N + 7;
          const auto A = randn(size_t((a_trans ? K : M) * lda), ++key);
          const auto B = randn(size_t(K * ldb + 1), ++key);
          const auto C0 = randn(size_t(M * ldc), ++key);
          // B's columns [0, col0 + N) in panels; the call starts at column col0
          const int64_t stride = K * cpu::kPanel + 9;
          const auto bp = panels_of(B, ldb, K, col0 + N, stride);
          auto C = C0, ref = C0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = N; j < ldc; ++j) C[size_t(i * ldc + j)] = sentinel;
          cpu::gemm_direct_panels(a_trans, M, N, K, alpha, A.data(), lda,
                                  cpu::PanelB{bp.data(), stride, col0}, beta, C.data(), ldc);
          cpu::gemm_direct(test::kernel_ctx(), a_trans, M, N, K, alpha, A.data(), lda,
                           B.data() + col0, ldb, beta, ref.data(), ldc);
          int64_t wrong = 0, outside = 0;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j)
              wrong += C[size_t(i * ldc + j)] != ref[size_t(i * ldc + j)];
            for (int64_t j = N; j < ldc; ++j) outside += C[size_t(i * ldc + j)] != sentinel;
          }
          CHECK(wrong == 0);
          CHECK(outside == 0);
        }
}

TEST_CASE("gemm_direct_rows applies its row operation to gemm_direct's product", "[gemm_direct]") {
  namespace cpu = kernels::cpu;
  if (!cpu::gemm_direct_native()) {
    WARN("SKIP: gemm_direct_rows needs AVX-512F and FMA, which this machine lacks");
    return;
  }
  const float sentinel = 4242.0f;
  uint64_t key = 9500;
  for (int64_t col0 : {0, 9})
    for (auto [M, N, K] : kPanelShapes) {
      INFO("col0 " << col0 << " M " << M << " N " << N << " K " << K);
      const float alpha = 0.37f;
      const int64_t lda = K + 3, ldb = col0 + N + 5, ldc = N + 7, ldp = N + 2;
      const auto A = randn(size_t(M * lda), ++key);
      const auto B = randn(size_t(K * ldb + 1), ++key);
      const auto P = randn(size_t(M * ldp), ++key);
      auto row = randn(size_t(M), ++key);
      // exp arguments from about -100 (below exp's cut at -87) to about +3
      for (auto& r : row) r = 3.0f + 30.0f * std::fabs(r);
      const int64_t stride = K * cpu::kPanel;
      const auto bp = panels_of(B, ldb, K, col0 + N, stride);
      std::vector<float> prod(size_t(M * ldc));
      cpu::gemm_direct(test::kernel_ctx(), false, M, N, K, alpha, A.data(), lda, B.data() + col0,
                       ldb, 0.0f, prod.data(), ldc);
      for (cpu::RowOp op : {cpu::RowOp::kExp, cpu::RowOp::kGrad}) {
        std::vector<float> C(size_t(M * ldc), sentinel);
        cpu::gemm_direct_rows(op, M, N, K, alpha, A.data(), lda,
                              cpu::PanelB{bp.data(), stride, col0}, C.data(), ldc, row.data(),
                              P.data(), ldp);
        double worst = 0.0;
        int64_t wrong = 0, outside = 0;
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) {
            const float x = prod[size_t(i * ldc + j)] - row[size_t(i)];
            const float c = C[size_t(i * ldc + j)];
            if (op == cpu::RowOp::kGrad) {
              wrong += c != P[size_t(i * ldp + j)] * x;  // the same two roundings
            } else if (x < -87.0f) {
              wrong += c != 0.0f;
            } else {
              const double ref = std::exp(double(x));
              worst = std::max(worst, std::fabs(c - ref) / ref);
            }
          }
          for (int64_t j = N; j < ldc; ++j) outside += C[size_t(i * ldc + j)] != sentinel;
        }
        INFO("op " << int(op));
        CHECK(worst <= 3e-7);  // about 2 ulp
        CHECK(wrong == 0);
        CHECK(outside == 0);
      }
    }
}

TEST_CASE("the native softmax row passes: max, exp and sum", "[gemm_direct]") {
  namespace cpu = kernels::cpu;
  if (!cpu::gemm_direct_native()) {
    WARN("SKIP: the native row passes need AVX-512F and FMA, which this machine lacks");
    return;
  }
  const float inf = std::numeric_limits<float>::infinity();
  uint64_t key = 9700;
  for (int64_t n : {0, 1, 7, 8, 15, 16, 17, 31, 40, 512, 517}) {
    INFO("n " << n);
    auto x = randn(size_t(n) + 1, ++key);
    for (auto& v : x) v *= 20.0f;
    if (n > 3) {
      x[2] = -inf;  // a masked score
      x[size_t(n - 1)] = std::numeric_limits<float>::quiet_NaN();
    }
    const float tail = x[size_t(n)];  // past the end: neither read into the max nor written
    float ref_max = -inf;
    for (int64_t j = 0; j < n; ++j)
      if (x[size_t(j)] > ref_max) ref_max = x[size_t(j)];
    CHECK(cpu::row_max_native(x.data(), n) == ref_max);
    if (n > 3) x[size_t(n - 1)] = 1.0f;
    const float m = n > 0 ? std::max(ref_max, 1.0f) : 0.0f;
    const std::vector<float> x0 = x;
    const float sum = cpu::exp_shift_sum_native(x.data(), n, m);
    double ref_sum = 0.0, worst = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      const double e = x0[size_t(j)] - m < -87.0f ? 0.0 : std::exp(double(x0[size_t(j)] - m));
      ref_sum += e;
      worst = std::max(worst, std::fabs(x[size_t(j)] - e) / std::max(e, 1e-300));
    }
    CHECK(worst <= 3e-7);
    CHECK(std::fabs(sum - ref_sum) <= 1e-6 * std::max(ref_sum, 1.0));
    CHECK(x[size_t(n)] == tail);
  }
}

TEST_CASE("gemm_direct_nt equals gemm_direct with B = Wᵀ", "[gemm_direct]") {
  // A linear layer's forward: C = alpha A Wᵀ + beta C with W [N, K] by rows.
  // Native, W is transposed 32 rows at a time into a panel that the same
  // tiles read, so the product is gemm_direct's on the transposed W bit for
  // bit; elsewhere both are sgemm calls, equal to rounding.
  namespace cpu = kernels::cpu;
  INFO("native AVX-512 kernel on this machine: " << cpu::gemm_direct_native());
  const float sentinel = -4242.0f;
  uint64_t key = 9900;
  for (float beta : {0.0f, 1.0f, -0.5f})
    for (auto [M, N, K] : {std::array<int64_t, 3>{1, 1, 1},
                           {8, 32, 16},
                           {13, 70, 37},
                           {256, 512, 256},
                           {100, 256, 512},
                           {33, 17, 1024},
                           {5, 40, 1500},  // K past the panel's bound: sgemm
                           {7, 5, 0}}) {
      INFO("beta " << beta << " M " << M << " N " << N << " K " << K);
      const float alpha = 0.37f;
      const int64_t lda = K + 3, ldw = K + 5, ldc = N + 7, ldb = N + 2;
      const auto A = randn(size_t(M * lda), ++key);
      const auto W = randn(size_t(N * ldw), ++key);
      const auto C0 = randn(size_t(M * ldc), ++key);
      std::vector<float> B(size_t(std::max<int64_t>(K, 1) * ldb));  // Wᵀ, K x N
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) B[size_t(k * ldb + n)] = W[size_t(n * ldw + k)];
      auto C = C0, ref = C0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = N; j < ldc; ++j) C[size_t(i * ldc + j)] = sentinel;
      cpu::gemm_direct_nt(test::kernel_ctx(), M, N, K, alpha, A.data(), lda, W.data(), ldw, beta,
                          C.data(), ldc);
      cpu::gemm_direct(test::kernel_ctx(), false, M, N, K, alpha, A.data(), lda, B.data(), ldb,
                       beta, ref.data(), ldc);
      const bool bitwise = cpu::gemm_direct_native() && K <= 1024;
      int64_t wrong = 0, outside = 0;
      double worst = 0.0;
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          const double c = C[size_t(i * ldc + j)], r = ref[size_t(i * ldc + j)];
          wrong += c != r;
          worst = std::max(worst, std::fabs(c - r) / (std::fabs(r) + 1.0));
        }
        for (int64_t j = N; j < ldc; ++j) outside += C[size_t(i * ldc + j)] != sentinel;
      }
      if (bitwise)
        CHECK(wrong == 0);
      else
        CHECK(worst <= 1e-4);
      CHECK(outside == 0);
    }
}
