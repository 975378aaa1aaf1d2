// The dlopen'ed cuBLAS table (see cublas_api.hpp).
#include "trident/kernels/cuda/cublas_api.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "trident/core/error.hpp"

namespace trident::kernels::cuda {
namespace {

const std::string kLibrary = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);

// The directory holding the CUDA runtime this process has loaded: cuBLAS
// ships next to it even when that directory is not on the library path.
std::string runtime_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) == 0 || !info.dli_fname)
    return "";
  const std::string path = info.dli_fname;
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

void* open_library() {
  // A chosen copy (e.g. the one in PyTorch's nvidia-cublas wheel) and no other.
  if (const char* chosen = std::getenv("TRIDENT_CUBLAS_LIBRARY"); chosen && *chosen) {
    if (void* h = dlopen(chosen, RTLD_NOW | RTLD_LOCAL)) return h;
    throw Error(std::string("cuBLAS: cannot load ") + chosen +
                " (TRIDENT_CUBLAS_LIBRARY): " + dlerror());
  }
  if (void* h = dlopen(kLibrary.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first_reason = dlerror();
  const std::string dir = runtime_directory();
  if (!dir.empty())
    if (void* h = dlopen((dir + kLibrary).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  throw Error("cuBLAS: cannot load " + kLibrary + ": " + first_reason +
              (dir.empty() ? "" : " (nor from " + dir + ")"));
}

template <class Fn>
void resolve(void* lib, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!fn) throw Error("cuBLAS: " + kLibrary + " has no " + name);
}

CublasApi load() {
  void* lib = open_library();  // kept open for the life of the process
  CublasApi api{};
  resolve(lib, "cublasCreate_v2", api.create);
  resolve(lib, "cublasDestroy_v2", api.destroy);
  resolve(lib, "cublasSetStream_v2", api.set_stream);
  resolve(lib, "cublasSetMathMode", api.set_math_mode);
  resolve(lib, "cublasGemmEx", api.gemm_ex);
  resolve(lib, "cublasGetStatusName", api.status_name);
  resolve(lib, "cublasGetStatusString", api.status_string);
  return api;
}

}  // namespace

namespace {
const CublasApi* fake_api = nullptr;  // set by tests only
}  // namespace

const CublasApi& cublas() {
  if (fake_api) return *fake_api;
  static const CublasApi api = load();
  return api;
}

void set_cublas_for_testing(const CublasApi* fake) { fake_api = fake; }

}  // namespace trident::kernels::cuda
