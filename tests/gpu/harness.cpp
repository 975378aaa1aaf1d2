// The GPU test harness's runner (see harness.hpp; the checks it offers are in
// harness_checks.cpp). Exit codes: 0 all cases passed, 1 a case failed (or a
// library is missing: one line), 77 no device (SKIP, with the reason on
// stdout).
#include "harness.hpp"

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>

#include "trident/kernels/cuda/cublas_api.hpp"

namespace {

// What the tests need besides the device: cuBLAS (loaded with dlopen). One
// line either way; exit 0 loaded, 1 not.
int check_libraries() {
  try {
    (void)gpu_test::cuda::cublas();
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("libraries: cuBLAS loaded\n");
  return 0;
}

}  // namespace

// test_gpu_X [FILTER]: the cases whose name contains FILTER.
// test_gpu_X --libraries: only loads the libraries (no device needed).
int main(int argc, char** argv) {
  using namespace gpu_test;
  if (argc > 1 && std::strcmp(argv[1], "--libraries") == 0) return check_libraries();
  if (cuda::device_count() == 0) {
    std::printf("SKIP: no CUDA device visible (%s); these tests need a GPU\n",
                cuda::no_device_reason().c_str());
    return 77;
  }
  const char* filter = argc > 1 ? argv[1] : "";
  // A library that is missing or a device that cannot be set up fails the
  // binary with one line, before any case runs.
  std::unique_ptr<cuda::StreamContext> context;
  try {
    context = std::make_unique<cuda::StreamContext>(0);
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  cuda::StreamContext& dc = *context;
  int failed_cases = 0, ran = 0;
  for (const Case& c : registry()) {
    if (!std::strstr(c.name, filter)) continue;
    ++ran;
    failures() = 0;
    std::printf("[ RUN  ] %s\n", c.name);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.fn(dc);
      dc.stream().synchronize(120.0, c.name);
    } catch (const std::exception& e) {
      expect(false, std::string("exception: ") + e.what());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ %s ] %s (%.2f s)\n", failures() ? "FAIL" : " OK ", c.name, s);
    failed_cases += failures() ? 1 : 0;
  }
  std::printf("%d of %d cases failed\n", failed_cases, ran);
  return failed_cases || ran == 0 ? 1 : 0;
}
