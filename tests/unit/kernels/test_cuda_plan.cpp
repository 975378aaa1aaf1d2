// The host-side logic of the CUDA backend, checked on the CPU: attention
// tiling and its causal skipping (every visible pair is covered exactly once,
// nothing past the mask is visited), shared-memory sizes against the GPUs'
// limits, grid sizing, the row-major to column-major GEMM mapping, and the
// deadline of device waits.
#include <catch2/catch.hpp>
#include <chrono>
#include <random>
#include <vector>

#include "trident/kernels/cuda/deadline.hpp"
#include "trident/kernels/cuda/plan.hpp"

namespace plan = trident::kernels::cuda::plan;
using trident::kernels::AttnShape;

namespace {

std::vector<AttnShape> shapes() {
  std::vector<AttnShape> out;
  std::mt19937 gen(7);
  std::uniform_int_distribution<int64_t> len(1, 150), off(0, 200);
  for (int n = 0; n < 200; ++n) {
    AttnShape s;
    s.Tq = len(gen);
    s.Tk = len(gen);
    s.causal = n % 4 != 0;
    s.q_pos0 = off(gen);
    s.k_pos0 = off(gen);
    out.push_back(s);
  }
  return out;
}

// Pairs the forward and dQ kernels visit: per query block, keys [0, end).
int64_t pairs_by_query_blocks(const AttnShape& s) {
  int64_t n = 0;
  for (int64_t b = 0; b < plan::attn_row_blocks(s.Tq); ++b) {
    const int64_t i0 = b * plan::kAttnBlockRows;
    const int64_t rows = std::min<int64_t>(plan::kAttnBlockRows, s.Tq - i0);
    const int64_t end = plan::attn_key_end(s, i0, rows);
    for (int64_t i = i0; i < i0 + rows; ++i)
      for (int64_t j = 0; j < end; ++j) n += plan::attn_visible(s, i, j);
  }
  return n;
}

// Pairs the dK/dV kernel visits: per key block, queries [begin, Tq).
int64_t pairs_by_key_blocks(const AttnShape& s) {
  int64_t n = 0;
  for (int64_t b = 0; b < plan::attn_row_blocks(s.Tk); ++b) {
    const int64_t j0 = b * plan::kAttnBlockRows;
    const int64_t keys = std::min<int64_t>(plan::kAttnBlockRows, s.Tk - j0);
    for (int64_t i = plan::attn_query_begin(s, j0); i < s.Tq; ++i)
      for (int64_t j = j0; j < j0 + keys; ++j) n += plan::attn_visible(s, i, j);
  }
  return n;
}

}  // namespace

TEST_CASE("attention tiling covers every visible pair and skips the masked ones") {
  for (const AttnShape& s : shapes()) {
    INFO("Tq " << s.Tq << " Tk " << s.Tk << " causal " << s.causal << " q_pos0 " << s.q_pos0
               << " k_pos0 " << s.k_pos0);
    const int64_t visible = trident::kernels::attention_visible_pairs(s);  // H = 1
    CHECK(pairs_by_query_blocks(s) == visible);
    CHECK(pairs_by_key_blocks(s) == visible);
    // The ranges are tight: the last key of a block's range is visible to the
    // block's last query, the first query of a key block's range sees its key.
    for (int64_t i0 = 0; i0 < s.Tq; i0 += plan::kAttnBlockRows) {
      const int64_t rows = std::min<int64_t>(plan::kAttnBlockRows, s.Tq - i0);
      const int64_t end = plan::attn_key_end(s, i0, rows);
      if (end > 0) CHECK(plan::attn_visible(s, i0 + rows - 1, end - 1));
      if (end < s.Tk) CHECK_FALSE(plan::attn_visible(s, i0 + rows - 1, end));
    }
    for (int64_t j0 = 0; j0 < s.Tk; j0 += plan::kAttnBlockRows) {
      const int64_t b = plan::attn_query_begin(s, j0);
      if (b < s.Tq) CHECK(plan::attn_visible(s, b, j0));
      if (b > 0) CHECK_FALSE(plan::attn_visible(s, b - 1, j0));
    }
  }
}

TEST_CASE("attention lane chunks and shared memory fit the GPUs") {
  CHECK(plan::attn_lane_chunks(0) == 0);
  CHECK(plan::attn_lane_chunks(1) == 1);
  CHECK(plan::attn_lane_chunks(16) == 1);
  CHECK(plan::attn_lane_chunks(32) == 1);
  CHECK(plan::attn_lane_chunks(33) == 2);
  CHECK(plan::attn_lane_chunks(64) == 2);
  CHECK(plan::attn_lane_chunks(96) == 4);
  CHECK(plan::attn_lane_chunks(128) == 4);
  CHECK(plan::attn_lane_chunks(256) == 8);
  CHECK(plan::attn_lane_chunks(257) == 0);
  // A100 allows 163 KiB of dynamic shared memory per block, H100/H200 227 KiB.
  const size_t sm80_limit = 163 * 1024;
  for (int D = 1; D <= plan::kAttnMaxHeadDim; ++D)
    for (auto k :
         {plan::AttnKernel::forward, plan::AttnKernel::backward_dq, plan::AttnKernel::backward_dkv})
      CHECK(plan::attn_smem_bytes(k, D) <= sm80_limit);
  // Head dims up to 128 run the forward without the opt-in above 48 KiB.
  CHECK(plan::attn_smem_bytes(plan::AttnKernel::forward, 128) <= 48 * 1024);
  // Exact size for one case: 16 rows of 64, a padded tile 32 x 65, a tile 32 x 64.
  CHECK(plan::attn_smem_bytes(plan::AttnKernel::forward, 64) == 4 * (16 * 64 + 32 * 65 + 32 * 64));
  // The tensor-core forward: D 64 and 128 only, within the A100's limit.
  CHECK(plan::attn_tc_supported(64));
  CHECK(plan::attn_tc_supported(128));
  CHECK_FALSE(plan::attn_tc_supported(96));
  CHECK(plan::attn_tc_smem_bytes(128) ==
        2 * (64 * 128 + 2 * 64 * 128) + 4 * (4 * 16 * 64 + 2 * 16 * 64 + 4 * 16 * 128));
  CHECK(plan::attn_tc_smem_bytes(128) <= sm80_limit);
  AttnShape s;
  s.Tq = 1000;
  s.H = 8;
  CHECK(plan::attn_workspace_bytes(s, false) == 0);
  CHECK(plan::attn_workspace_bytes(s, true) == 1000 * 8 * sizeof(float));
}

TEST_CASE("grid and row sizing") {
  CHECK(plan::grid_for(0) == 1);
  CHECK(plan::grid_for(1) == 1);
  CHECK(plan::grid_for(256) == 1);
  CHECK(plan::grid_for(257) == 2);
  CHECK(plan::grid_for(int64_t(1) << 40) == plan::kMaxBlocks);
  CHECK(plan::row_threads(1) == 32);
  CHECK(plan::row_threads(33) == 64);
  CHECK(plan::row_threads(64) == 64);
  CHECK(plan::row_threads(100000) == plan::kThreads);
  CHECK(plan::fits_int32(INT32_MAX));
  CHECK_FALSE(plan::fits_int32(int64_t(INT32_MAX) + 1));
  CHECK_FALSE(plan::fits_int32(-1));
}

namespace {

// cuBLAS's contract on column-major data: C = op(A) op(B), A's element (r, c)
// at A[r + c * lda].
void column_major_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* A,
                       int64_t lda, const double* B, int64_t ldb, double* C, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const double a = ta ? A[p + i * lda] : A[i + p * lda];
        const double b = tb ? B[j + p * ldb] : B[p + j * ldb];
        s += a * b;
      }
      C[i + j * ldc] = s;
    }
}

}  // namespace

TEST_CASE("row-major GEMM maps onto cuBLAS's column-major call") {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t M = 5, N = 7, K = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      // Row-major storage with padded row strides.
      const int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
      std::vector<double> A(size_t((ta ? K : M) * lda)), B(size_t((tb ? N : K) * ldb));
      for (auto& x : A) x = u(gen);
      for (auto& x : B) x = u(gen);
      auto a = [&](int64_t i, int64_t p) { return ta ? A[p * lda + i] : A[i * lda + p]; };
      auto b = [&](int64_t p, int64_t j) { return tb ? B[j * ldb + p] : B[p * ldb + j]; };
      std::vector<double> C(size_t(M * ldc), 0.0);
      const plan::ColumnMajorGemm g = plan::column_major(ta, tb, M, N, K);
      column_major_gemm(g.trans_first, g.trans_second, g.m, g.n, g.k, B.data(), ldb, A.data(), lda,
                        C.data(), ldc);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double want = 0.0;
          for (int64_t p = 0; p < K; ++p) want += a(i, p) * b(p, j);
          CHECK(C[size_t(i * ldc + j)] == Approx(want).epsilon(1e-12));
        }
    }
}

TEST_CASE("device waits poll until ready and end at their deadline") {
  using trident::kernels::cuda::wait_until;
  int polls = 0;
  wait_until([&] { return ++polls == 500; }, 5.0, "event");
  CHECK(polls == 500);

  const auto t0 = std::chrono::steady_clock::now();
  try {
    wait_until([] { return false; }, 0.05, "attention forward on cuda:0");
    FAIL("no timeout");
  } catch (const trident::TimeoutError& e) {
    CHECK(std::string(e.what()).find("attention forward on cuda:0") != std::string::npos);
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(waited >= 0.05);
  CHECK(waited < 1.0);
}
