// The fp32 GEMMs' host parameters (kernels/cpu/host_params.hpp): the rules
// on cache-size profiles (Zen 4 gives the constants tuned there; Skylake-SP,
// Ice Lake-SP and Sapphire Rapids what an Intel host will run), sysfs read
// from a fixture folder, TRIDENT_CPU_GEMM_BLOCKS's values refused with the
// rule named, and the linear layers' three GEMMs run on THIS machine under
// each profile's parameters and the sweep's: within 1e-5 of the fp64
// product, and bit for bit the same wherever the own kernel runs (no
// parameter but direct and kc changes a result).
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gemm_direct.hpp"
#include "host_params.hpp"
#include "kernel_ctx.hpp"
#include "random.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/backends.hpp"

using namespace trident;
namespace cpu = trident::kernels::cpu;
using trident::testing::randn;

namespace {

constexpr int64_t kKiB = 1 << 10, kMiB = 1 << 20;

// The cache profiles (bytes): L1d, its ways, L2, L3 (as sysfs lists them).
cpu::HostCaches zen4() { return {32 * kKiB, 1 * kMiB, 32 * kMiB, 64, 8, "fixture"}; }
cpu::HostCaches skylake_sp() {
  return {32 * kKiB, 1 * kMiB, 38 * kMiB + 512 * kKiB, 64, 8, "fixture"};
}
cpu::HostCaches icelake_sp() { return {48 * kKiB, 1280 * kKiB, 48 * kMiB, 64, 12, "fixture"}; }
cpu::HostCaches sapphire_rapids() { return {48 * kKiB, 2 * kMiB, 105 * kMiB, 64, 12, "fixture"}; }

// The constants gemm_direct.cpp and linear.cpp held before the parameters
// were derived (tuned on Zen 5, run on Zen 4).
const cpu::GemmParams kTuned{1 * kMiB, 1024, 0, 8, 16};

// Restores the parameters of the process's start when a test ends.
struct ParamsGuard {
  ~ParamsGuard() { cpu::reset_gemm_params(); }
};

// The three GEMMs of one linear layer (y = x Wᵀ, dx = dy W, dW = dyᵀ x).
struct LinearOut {
  std::vector<float> y, dx, dw;
};
struct LinearCase {
  int64_t T, in, out;
  std::vector<float> x, w, dy;
};

LinearCase linear_case(int64_t T, int64_t in, int64_t out, uint64_t key) {
  return {T, in, out, randn(T * in, key), randn(out * in, key + 1), randn(T * out, key + 2)};
}

LinearOut run_linear(const LinearCase& c) {
  LinearOut o{std::vector<float>(size_t(c.T * c.out)), std::vector<float>(size_t(c.T * c.in)),
              std::vector<float>(size_t(c.out * c.in), 0.0f)};
  const auto& ctx = test::kernel_ctx();
  cpu::linear_forward(ctx, c.x.data(), c.w.data(), c.T, c.in, c.out, o.y.data());
  cpu::linear_backward_input(ctx, c.dy.data(), c.w.data(), c.T, c.in, c.out, o.dx.data(), 0.0f);
  cpu::linear_backward_weight(ctx, c.dy.data(), c.x.data(), c.T, c.in, c.out, o.dw.data());
  return o;
}

// Relative L2 error of got, M x N, against the fp64 sum over k of A(i, k) B(j, k) with
// A(i, k) = a[i * ai + k * ak] and B(j, k) = b[j * bj + k * bk].
double rel_err(const std::vector<float>& got, int64_t M, int64_t N, int64_t K, const float* a,
               int64_t ai, int64_t ak, const float* b, int64_t bj, int64_t bk) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += double(a[i * ai + k * ak]) * double(b[j * bj + k * bk]);
      const double d = double(got[size_t(i * N + j)]) - s;
      num += d * d;
      den += s * s;
    }
  return std::sqrt(num / den);
}

void check_against_fp64(const LinearCase& c, const LinearOut& o) {
  const int64_t T = c.T, in = c.in, out = c.out;
  CHECK(rel_err(o.y, T, out, in, c.x.data(), in, 1, c.w.data(), in, 1) < 1e-5);
  CHECK(rel_err(o.dx, T, in, out, c.dy.data(), out, 1, c.w.data(), 1, in) < 1e-5);
  CHECK(rel_err(o.dw, out, in, T, c.dy.data(), 1, out, c.x.data(), 1, in) < 1e-5);
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p) << text << "\n";
}

// A sysfs cache folder: index<i>/{level,type,size,coherency_line_size,ways_of_associativity}.
void write_index(const std::filesystem::path& root, int i, const char* level, const char* type,
                 const char* size, const char* ways) {
  const auto d = root / ("index" + std::to_string(i));
  std::filesystem::create_directories(d);
  write_file(d / "level", level);
  write_file(d / "type", type);
  write_file(d / "size", size);
  write_file(d / "coherency_line_size", "64");
  write_file(d / "ways_of_associativity", ways);
}

}  // namespace

TEST_CASE("the rules give Zen 4's caches the tuned constants, Intel's their own", "[host_params]") {
  CHECK(cpu::derive_gemm_params(zen4()) == kTuned);
  CHECK(cpu::derive_gemm_params(cpu::HostCaches{}) == kTuned);  // nothing known: the tuned values
  // Skylake-SP: the same L1d and L2 as Zen 4, so the same parameters
  CHECK(cpu::derive_gemm_params(skylake_sp()) == kTuned);
  CHECK(cpu::derive_gemm_params(icelake_sp()) == cpu::GemmParams{1280 * kKiB, 1280, 0, 12, 16});
  CHECK(cpu::derive_gemm_params(sapphire_rapids()) == cpu::GemmParams{2 * kMiB, 2048, 0, 12, 16});
  CHECK(cpu::format_gemm_params(kTuned) == "direct=1024K,kc=1024,mc=0,prefetch=8,nt_rows=16");
}

TEST_CASE("the caches are read from sysfs's layout", "[host_params]") {
  const auto root = std::filesystem::temp_directory_path() /
                    ("trident-host-params-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  write_index(root, 0, "1", "Data", "48K", "12");
  write_index(root, 1, "1", "Instruction", "32K", "8");
  write_index(root, 2, "2", "Unified", "2048K", "16");
  write_index(root, 3, "3", "Unified", "107520K", "15");
  const cpu::HostCaches c = cpu::read_sysfs_caches(root.string());
  std::filesystem::remove_all(root);
  CHECK(c.l1d == 48 * kKiB);
  CHECK(c.l1d_ways == 12);
  CHECK(c.l2 == 2 * kMiB);
  CHECK(c.l3 == 105 * kMiB);
  CHECK(c.line == 64);
  CHECK(cpu::derive_gemm_params(c) == cpu::derive_gemm_params(sapphire_rapids()));
  CHECK(cpu::read_sysfs_caches((root / "absent").string()).l1d == 0);
}

TEST_CASE("cpuid's cache leaf agrees with sysfs on this host", "[host_params]") {
  const cpu::HostCaches sys = cpu::read_sysfs_caches("/sys/devices/system/cpu/cpu0/cache");
  const cpu::HostCaches id = cpu::read_cpuid_caches();
  if (sys.l1d == 0 || id.l1d == 0) {
    WARN("SKIP: sysfs (L1d " << sys.l1d << ") or cpuid (L1d " << id.l1d
                             << ") lists no caches here, so they cannot be compared");
    return;
  }
  // the fallback gives the rules the same inputs as sysfs (L3 not compared:
  // the rules do not read it)
  CHECK(id.l1d == sys.l1d);
  CHECK(id.l1d_ways == sys.l1d_ways);
  CHECK(id.l2 == sys.l2);
  CHECK(id.line == sys.line);
  CHECK(cpu::derive_gemm_params(id) == cpu::derive_gemm_params(sys));
}

TEST_CASE("this host's parameters are the rules' for its caches", "[host_params]") {
  const cpu::HostInfo& h = cpu::host_info();
  INFO(h.model << " (" << h.vendor << "): L1d " << h.caches.l1d << " " << h.caches.l1d_ways
               << "-way, L2 " << h.caches.l2 << ", L3 " << h.caches.l3 << " from "
               << h.caches.source);
  if (cpu::gemm_params_overridden()) {
    WARN("TRIDENT_CPU_GEMM_BLOCKS is set: the derived parameters are not in use");
    return;
  }
  CHECK(cpu::gemm_params() == cpu::derive_gemm_params(h.caches));
  // where this host's caches are Zen 4's (the machine of these tests), the tuned constants
  if (h.caches.l1d == 32 * kKiB && h.caches.l1d_ways == 8 && h.caches.l2 == kMiB)
    CHECK(cpu::gemm_params() == kTuned);
}

TEST_CASE("TRIDENT_CPU_GEMM_BLOCKS's values are parsed or refused with the rule", "[host_params]") {
  const cpu::GemmParams p =
      cpu::parse_gemm_params("direct=2M,kc=2048,mc=64,prefetch=12,nt_rows=32", kTuned);
  CHECK(p == cpu::GemmParams{2 * kMiB, 2048, 64, 12, 32});
  CHECK(cpu::parse_gemm_params("prefetch=0", kTuned).prefetch == 0);
  CHECK(cpu::parse_gemm_params("direct=0", kTuned).direct_bytes == 0);
  CHECK(cpu::parse_gemm_params("direct=4096", kTuned).direct_bytes == 4096);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"mc=12", "multiple of 8"},        {"prefetch=65", "0 (none) to 64"},
      {"kc=0", "kc must be 1 to 65536"}, {"nt_rows=4", "multiple of 8 from 8"},
      {"foo=1", "unknown key"},          {"direct=1G", "whole number"},
      {"kc=", "whole number"},           {"kc=abc", "whole number"},
      {"kc=-5", "whole number"},         {"kc=99999999999999999999", "whole number"},
      {"kc", "expected key=value"},      {"", "empty item"},
      {"kc=1024,,mc=0", "empty item"},   {"direct=8192M", "4096M"}};
  for (const auto& [text, rule] : bad) {
    INFO("TRIDENT_CPU_GEMM_BLOCKS=" << text);
    try {
      cpu::parse_gemm_params(text, kTuned);
      FAIL("accepted");
    } catch (const InputError& e) {
      const std::string what = e.what();
      CHECK(what.find("TRIDENT_CPU_GEMM_BLOCKS") != std::string::npos);
      CHECK(what.find(rule) != std::string::npos);
      CHECK(what.find('\n') == std::string::npos);
    }
  }
}

TEST_CASE("the linear GEMMs are right on this host under every profile's parameters",
          "[host_params]") {
  INFO("own AVX-512 kernel on this machine: " << cpu::gemm_direct_native());
  const ParamsGuard guard;
  // (T, in, out): the benchmark model's shapes at small T; K = 1536 between Zen's kc (1024)
  // and Sapphire Rapids' (2048) with x of 1.2 MB between their direct bounds (1 and 2 MiB);
  // row, column and depth tails
  const std::vector<LinearCase> cases = {linear_case(96, 256, 1024, 7100),
                                         linear_case(200, 1536, 96, 7200),
                                         linear_case(333, 1100, 70, 7300)};
  const std::vector<cpu::GemmParams> profiles = {
      cpu::derive_gemm_params(zen4()), cpu::derive_gemm_params(skylake_sp()),
      cpu::derive_gemm_params(icelake_sp()), cpu::derive_gemm_params(sapphire_rapids())};
  for (const LinearCase& c : cases)
    for (const cpu::GemmParams& p : profiles) {
      INFO("T " << c.T << " in " << c.in << " out " << c.out << ": " << cpu::format_gemm_params(p));
      cpu::set_gemm_params(p);
      check_against_fp64(c, run_linear(c));
    }
}

TEST_CASE("no parameter but direct and kc changes the own kernel's bits", "[host_params]") {
  if (!cpu::gemm_direct_native()) {
    WARN("SKIP: no AVX-512F and FMA here, so the own kernel never runs (sgemm only)");
    return;
  }
  const ParamsGuard guard;
  cpu::GemmParams own = kTuned;
  own.direct_bytes = int64_t(1) << 32;
  own.kc = 65536;
  for (const LinearCase& c : {linear_case(200, 1536, 96, 7400), linear_case(77, 300, 520, 7500)}) {
    cpu::set_gemm_params(own);
    const LinearOut ref = run_linear(c);
    check_against_fp64(c, ref);
    // the sweep's grid (bench gemm --sweep) and the Intel profiles' prefetch distances
    for (const char* text :
         {"prefetch=0", "prefetch=4", "prefetch=12", "prefetch=24", "mc=8", "mc=64", "mc=128",
          "mc=512", "nt_rows=8", "nt_rows=64", "mc=64,prefetch=12,nt_rows=32"}) {
      INFO("T " << c.T << " in " << c.in << " out " << c.out << ": " << text);
      cpu::set_gemm_params(cpu::parse_gemm_params(text, own));
      const LinearOut o = run_linear(c);
      CHECK(o.y == ref.y);
      CHECK(o.dx == ref.dx);
      CHECK(o.dw == ref.dw);
    }
  }
}
