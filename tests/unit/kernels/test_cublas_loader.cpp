// cuBLAS is loaded on demand (kernels/cuda/cublas_api.cpp), not linked: the
// table resolves every function from the installed library, and until the
// first use the process has not mapped cuBLAS or cuBLASLt (which cost a
// CPU-only rank ~210 MB of resident memory when they were linked). Needs no
// GPU: loading a library does not touch the device.
#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "trident/kernels/cuda/cublas_api.hpp"

namespace {

bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("cuBLAS is mapped only once the CUDA backend asks for it") {
  REQUIRE_FALSE(mapped("libcublasLt"));
  REQUIRE_FALSE(mapped("libcublas.so"));
  const auto& api = trident::kernels::cuda::cublas();
  CHECK(api.create != nullptr);
  CHECK(api.destroy != nullptr);
  CHECK(api.set_stream != nullptr);
  CHECK(api.set_math_mode != nullptr);
  CHECK(api.gemm_ex != nullptr);
  CHECK(std::string(api.status_name(CUBLAS_STATUS_NOT_INITIALIZED)) ==
        "CUBLAS_STATUS_NOT_INITIALIZED");
  CHECK(mapped("libcublas.so"));
  CHECK(&trident::kernels::cuda::cublas() == &api);  // loaded once
}
