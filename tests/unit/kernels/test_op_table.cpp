// The op table (kernels/op_table.hpp) walked row by row: every op has a CPU
// f32 row and a bf16 row on every device that has its f32 row; no row is
// there twice; a missing row is one error naming op, device and dtype; and
// every CUDA row (op_list.inc's f32 rows, cuda_rows.inc's native ones) is
// listed once and names a tests/gpu case that exists, which compares it with
// the CPU reference.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernel_ctx.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/cpu_bf16.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/op_table.hpp"

using namespace trident;
using namespace trident::kernels;

namespace {

constexpr int kOps = int(Op::count);

const OpRow* find(Op op, DeviceType device, DType dtype) {
  for (const OpRow& r : op_rows())
    if (r.op == op && r.device == device && r.dtype == dtype) return &r;
  return nullptr;
}

struct CudaRow {
  Op op;
  DType dtype;
  std::string test;
};

const std::vector<CudaRow>& cuda_rows() {
  static const std::vector<CudaRow> rows = {
// every op's f32 row (op_list.inc names its test), then the native rows
#define TRIDENT_OP(op, roles, names, test, ...) {Op::op, DType::f32, test},
#include "trident/kernels/op_list.inc"
#undef TRIDENT_OP
#define TRIDENT_CUDA_ROW(op, dtype, test) {Op::op, DType::dtype, test},
#include "trident/kernels/cuda_rows.inc"
#undef TRIDENT_CUDA_ROW
  };
  return rows;
}

// The text of every tests/gpu source file.
std::string gpu_test_sources() {
  const char* root = std::getenv("TRIDENT_SOURCE_DIR");
  INFO("TRIDENT_SOURCE_DIR (set by ctest) names the source tree");
  REQUIRE(root != nullptr);
  std::string all;
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(root) / "tests/gpu")) {
    if (e.path().extension() != ".cpp") continue;
    std::ifstream in(e.path());
    all.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return all;
}

}  // namespace

TEST_CASE("every op has a cpu f32 row and a cpu bf16 row", "[op_table]") {
  for (int i = 0; i < kOps; ++i) {
    const Op op = Op(i);
    INFO(op_name(op));
    REQUIRE(find(op, DeviceType::cpu, DType::f32) != nullptr);
    REQUIRE(find(op, DeviceType::cpu, DType::bf16) != nullptr);
    bool native = false;  // the CPU's native bf16 rows (cpu_bf16.hpp), else the staged row
    for (const OpRow& r : cpu::bf16_rows()) native = native || r.op == op;
    REQUIRE((find(op, DeviceType::cpu, DType::bf16)->kernel == &run_staged) == !native);
  }
}

TEST_CASE("no row is in the table twice, and none is for the emulated device", "[op_table]") {
  std::set<std::tuple<int, int, int>> seen;
  for (const OpRow& r : op_rows()) {
    INFO(op_name(r.op) << " " << dtype_name(r.dtype));
    REQUIRE(seen.insert({int(r.op), int(r.device), int(r.dtype)}).second);
    REQUIRE(r.device != DeviceType::emulated);
    REQUIRE(r.kernel != nullptr);
  }
}

TEST_CASE("every op's roles name its tensors", "[op_table]") {
  for (int i = 0; i < kOps; ++i) {
    const std::string roles = op_roles(Op(i));
    INFO(op_name(Op(i)));
    REQUIRE(!roles.empty());
    REQUIRE(roles.size() <= OpCall{}.t.size());
    REQUIRE(roles.find_first_not_of("iioub?x") == std::string::npos);
    REQUIRE(op_arg_name(Op(i), int(roles.size()) - 1).find("tensor") == std::string::npos);
  }
}

TEST_CASE("a missing row is one error naming op, device and dtype", "[op_table]") {
  const auto& ctx = test::kernel_ctx();
  OpCall c;
  c.op = Op::fill;
  c.t[0] = Tensor::empty({4}, cpu_allocator(), DType::f64);
  REQUIRE(call_dtype(c) == DType::f64);
  REQUIRE_THROWS_WITH(run_op(ctx, c),
                      Catch::Contains("kernels::fill: no kernel for device cpu and dtype f64"));
}

TEST_CASE("every CUDA row names a tests/gpu case against the CPU reference", "[op_table]") {
  const std::string sources = gpu_test_sources();
  for (const CudaRow& r : cuda_rows()) {
    INFO(op_name(r.op) << " " << dtype_name(r.dtype) << ": " << r.test);
    REQUIRE(sources.find("GPU_TEST(\"" + r.test + "\")") != std::string::npos);
  }
  std::set<std::pair<int, int>> listed_once;
  for (const CudaRow& r : cuda_rows()) {
    INFO(op_name(r.op) << " " << dtype_name(r.dtype) << " is listed once");
    REQUIRE(listed_once.insert({int(r.op), int(r.dtype)}).second);
  }
  // (every op's f32 row is listed: op_list.inc's entry carries its GPU test)
}

TEST_CASE("every CUDA row of this build is listed (a native one as itself)", "[op_table]") {
  int cuda = 0;
  for (const OpRow& r : op_rows()) {
    if (r.device != DeviceType::cuda) continue;
    ++cuda;
    const bool staged = r.kernel == &run_staged;
    const DType listed_as = staged ? DType::f32 : r.dtype;
    bool listed = false;
    for (const CudaRow& c : cuda_rows()) listed = listed || (c.op == r.op && c.dtype == listed_as);
    INFO(op_name(r.op) << " " << dtype_name(r.dtype));
    REQUIRE(listed);
  }
  if (cuda == 0) SUCCEED("this build has no CUDA backend: its rows are checked in a CUDA build");
}

TEST_CASE("the staged row writes an output it does not read (beta 0)", "[op_table]") {
  // linear_backward_input's dx is read only when beta != 0, but written always:
  // a bf16 dx full of NaN must come back as the f32 result rounded.
  const auto& ctx = test::kernel_ctx();
  Tensor dy({4, 6}), w32({6, 8}), want32({4, 8});
  rng::fill_normal(dy.ptr(), dy.numel(), 1, 0, 1.0f);
  rng::fill_normal(w32.ptr(), w32.numel(), 2, 0, 1.0f);
  Tensor w = Tensor::empty({6, 8}, cpu_allocator(), DType::bf16);
  Tensor dx = Tensor::empty({4, 8}, cpu_allocator(), DType::bf16);
  Tensor want = Tensor::empty({4, 8}, cpu_allocator(), DType::bf16);
  convert(ctx, w32, w);
  convert(ctx, w, w32);  // the f32 reference reads the same bf16 values
  std::vector<uint16_t> nan(size_t(dx.numel()), 0x7fc0);
  std::memcpy(dx.data<uint16_t>(), nan.data(), dx.bytes());
  // the staged row itself, whatever TRIDENT_CPU_BF16 picks for the table's
  // cpu bf16 row (run outside ctest, the native one)
  OpCall call{Op::linear_backward_input, {dy, w, dx}};
  call.n = {4, 8, 6};  // T, in, out, as linear_backward_input derives them
  call.f = 0.0f;       // beta
  REQUIRE(call_dtype(call) == DType::bf16);
  run_staged(ctx, call);
  linear_backward_input(ctx, dy, w32, want32, 0.0f);
  convert(ctx, want32, want);
  REQUIRE(std::memcmp(dx.data<uint16_t>(), want.data<uint16_t>(), dx.bytes()) == 0);
}
