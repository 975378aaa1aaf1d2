// The benchmark engine (trident/bench/engine.hpp): rows drawn at global
// positions agree whichever rank draws them, the spot check counts a row off
// by more than its tolerance (and a NaN row), sizes parse or name the flag,
// the verdict's exit code, the reductions over ranks per iteration, tensors
// drawn in f32 or bf16 with the values they hold, and the best-of timer.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>

#include "trident/bench/engine.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/functional.hpp"

using namespace trident;

TEST_CASE("rows_at draws the same row for a position whichever subset holds it") {
  const int64_t row = 6;
  const auto all = bench::rows_at(bench::all_positions(8), row, "test.q");
  const auto some = bench::rows_at({5, 2}, row, "test.q");
  REQUIRE(all.size() == 8 * size_t(row));
  for (int64_t d = 0; d < row; ++d) {
    CHECK(some[size_t(d)] == all[size_t(5 * row + d)]);
    CHECK(some[size_t(row + d)] == all[size_t(2 * row + d)]);
  }
  CHECK(bench::rows_at({5}, row, "test.k")[0] != some[0]);  // another stream
}

TEST_CASE("SpotCheck counts rows off by more than tol, and NaN rows") {
  const double ref[3] = {1.0, -2.0, 2.0};  // norm 3
  bench::SpotCheck c;
  const float exact[3] = {1.0f, -2.0f, 2.0f};
  c.add(exact, ref, 3);
  CHECK(c.wrong == 0);
  CHECK(c.worst == 0.0);
  const float close[3] = {1.0f + 1.5e-4f, -2.0f, 2.0f};  // relative error 5e-5
  c.add(close, ref, 3);
  CHECK(c.wrong == 0);
  const float off[3] = {1.0f + 6e-4f, -2.0f, 2.0f};  // 2e-4 > 1e-4
  c.add(off, ref, 3);
  CHECK(c.wrong == 1);
  CHECK(c.worst == Approx(2e-4).epsilon(1e-3));
  const float nan[3] = {std::numeric_limits<float>::quiet_NaN(), -2.0f, 2.0f};
  c.add(nan, ref, 3);
  CHECK(c.wrong == 2);
}

TEST_CASE("check_attention_row holds the CPU kernel to the fp64 definition") {
  kernels::AttnShape s;
  s.Tq = s.Tk = 16;
  s.H = s.Hkv = 2;
  s.D = 8;
  s.scale = 1.0f / std::sqrt(8.0f);
  s.causal = true;
  const int64_t n = s.Tq * s.H * s.D;
  const auto q = bench::rows_at(bench::all_positions(s.Tq), s.H * s.D, "t.q");
  const auto k = bench::rows_at(bench::all_positions(s.Tk), s.H * s.D, "t.k");
  const auto v = bench::rows_at(bench::all_positions(s.Tk), s.H * s.D, "t.v");
  std::vector<float> out(static_cast<size_t>(n)), lse(static_cast<size_t>(s.Tq * s.H));
  const kernels::DeviceContext host(Device::cpu());
  const auto on_host = [](auto& buf, std::vector<int64_t> shape) {
    return Tensor::borrow(const_cast<float*>(buf.data()), std::move(shape), Device::cpu());
  };
  kernels::attention_forward(host.ctx(), s, on_host(q, {s.Tq, s.H, s.D}),
                             on_host(k, {s.Tk, s.Hkv, s.D}), on_host(v, {s.Tk, s.Hkv, s.D}),
                             on_host(out, {s.Tq, s.H, s.D}), on_host(lse, {s.Tq, s.H}));
  bench::SpotCheck c;
  for (int64_t i : {int64_t(0), int64_t(7), int64_t(15)})
    for (int h : {0, 1})
      bench::check_attention_row(c, s, q.data(), k.data(), v.data(), i, h,
                                 out.data() + (i * s.H + h) * s.D);
  CHECK(c.wrong == 0);
  CHECK(c.worst < 1e-5);
  out[size_t((7 * s.H + 1) * s.D + 3)] += 0.5f;
  bench::check_attention_row(c, s, q.data(), k.data(), v.data(), 7, 1,
                             out.data() + (7 * s.H + 1) * s.D);
  CHECK(c.wrong == 1);
}

TEST_CASE("parse_size reads byte counts and names the flag otherwise") {
  CHECK(bench::parse_size("--min-bytes", "8") == 8);
  CHECK(bench::parse_size("--min-bytes", "64K") == 65536);
  CHECK(bench::parse_size("--min-bytes", "16m") == (size_t(16) << 20));
  CHECK(bench::parse_size("--min-bytes", "1G") == (size_t(1) << 30));
  for (const char* bad : {"1X", "0", "K", ""})
    CHECK_THROWS_WITH(bench::parse_size("--max-bytes", bad), Catch::Contains("--max-bytes"));
  CHECK_THROWS_AS(bench::parse_size("--max-bytes", "1X"), InputError);
}

TEST_CASE("the verdict's exit code is 1 when anything was wrong") {
  bench::Verdict v("wrong rows in total");
  CHECK(v.exit_code() == 0);
  v.add(0);
  CHECK(v.exit_code() == 0);
  v.add(3);
  v.add(2);
  CHECK(v.wrong() == 5);
  CHECK(v.exit_code() == 1);
}

TEST_CASE("RankSeries reduces each iteration over the ranks") {
  bench::RankSeries s;
  s.ranks = 3, s.iters = 2;
  s.values = {1, 10, 5, 20, 3, 30};  // rank-major: rank r, iteration it
  CHECK(s.at(1, 0) == 5);
  CHECK(s.slowest_per_iteration() == std::vector<double>{5, 30});
  CHECK(s.median_per_iteration() == std::vector<double>{3, 20});
}

TEST_CASE("drawn_tensor holds the values it reports: f32 as drawn, bf16 rounded") {
  const kernels::DeviceContext host(Device::cpu());
  std::vector<float> f32_values, bf16_values;
  const Tensor f = bench::drawn_tensor(host.ctx(), {3, 5}, "test.drawn", DType::f32, f32_values);
  const Tensor b = bench::drawn_tensor(host.ctx(), {3, 5}, "test.drawn", DType::bf16, bf16_values);
  REQUIRE(f.dtype() == DType::f32);
  REQUIRE(b.dtype() == DType::bf16);
  REQUIRE(f32_values.size() == 15);
  REQUIRE(bf16_values.size() == 15);
  bool any_rounded = false;
  for (size_t i = 0; i < 15; ++i) {
    CHECK(f.data<float>()[i] == f32_values[i]);
    // bf16: the f32 pattern's upper half, widened exactly, within 2^-8 relative
    uint32_t bits = 0;
    std::memcpy(&bits, &bf16_values[i], sizeof bits);
    CHECK((bits & 0xffffu) == 0);
    CHECK(uint16_t(bits >> 16) == b.data<uint16_t>()[i]);
    CHECK(std::fabs(bf16_values[i] - f32_values[i]) <= std::ldexp(std::fabs(f32_values[i]), -8));
    any_rounded = any_rounded || bf16_values[i] != f32_values[i];
  }
  CHECK(any_rounded);
}

TEST_CASE("time_best keeps the smallest wall and CPU time of its calls") {
  int calls = 0;
  volatile double sink = 0;
  const bench::BestTimes t = bench::time_best(3, [&] {
    ++calls;
    for (int i = 0; i < 200000 / calls; ++i) sink = sink + std::sqrt(double(i));
  });
  CHECK(calls == 3);
  CHECK(t.wall_s > 0);
  CHECK(t.cpu_s >= 0);
  CHECK(t.wall_s < 1.0);
  CHECK(bench::cpu_model_name().size() > 0);
}
