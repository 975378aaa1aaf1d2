// CUDA and NVML probes for topology detection, through dlopen: the CPU build
// and CPU machines need neither library, and a GPU node's driver provides
// them at run time (NVML's header is not even part of the CUDA toolkit).
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "trident/topo/devices.hpp"

namespace trident {

namespace {

// The few entry points used, with the C signatures of their libraries.
struct CudaApi {
  // runtime (libcudart)
  int (*getDeviceCount)(int*) = nullptr;
  int (*deviceGetPCIBusId)(char*, int, int) = nullptr;
  // driver (libcuda), used when no runtime library is on the loader path
  int (*cuInit)(unsigned) = nullptr;
  int (*cuDeviceGetCount)(int*) = nullptr;
  int (*cuDeviceGet)(int*, int) = nullptr;
  int (*cuDeviceGetPCIBusId)(char*, int, int) = nullptr;
  bool runtime = false, driver = false;
};

template <typename F>
void bind(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(lib, name));
}

// Loaded once per process; the libraries stay loaded (the driver cannot be
// unloaded safely once initialised).
const CudaApi& cuda_api() {
  static const CudaApi api = [] {
    CudaApi a;
    for (const char* name : {"libcudart.so", "libcudart.so.13", "libcudart.so.12"}) {
      if (void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) {
        bind(lib, "cudaGetDeviceCount", a.getDeviceCount);
        bind(lib, "cudaDeviceGetPCIBusId", a.deviceGetPCIBusId);
        a.runtime = a.getDeviceCount && a.deviceGetPCIBusId;
        if (a.runtime) break;
      }
    }
    if (!a.runtime) {
      if (void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
        bind(lib, "cuInit", a.cuInit);
        bind(lib, "cuDeviceGetCount", a.cuDeviceGetCount);
        bind(lib, "cuDeviceGet", a.cuDeviceGet);
        bind(lib, "cuDeviceGetPCIBusId", a.cuDeviceGetPCIBusId);
        a.driver = a.cuInit && a.cuDeviceGetCount && a.cuDeviceGet && a.cuDeviceGetPCIBusId &&
                   a.cuInit(0) == 0;
      }
    }
    return a;
  }();
  return api;
}

std::string pci_bus_id(int device) {
  const CudaApi& a = cuda_api();
  char id[64] = {0};
  if (a.runtime) {
    if (a.deviceGetPCIBusId(id, sizeof id, device) != 0) return "";
  } else if (a.driver) {
    int dev = 0;
    if (a.cuDeviceGet(&dev, device) != 0 || a.cuDeviceGetPCIBusId(id, sizeof id, dev) != 0)
      return "";
  } else {
    return "";
  }
  return id;
}

// NVML's fabric record (nvml.h, R525+): cluster UUID, status, clique, state.
struct FabricInfo {
  unsigned char cluster_uuid[16];
  int status;
  unsigned int clique_id;
  unsigned char state;
};
constexpr unsigned char kFabricStateCompleted = 3;
constexpr unsigned kMaxNvlinks = 18;  // NVML_NVLINK_MAX_LINKS on Hopper

struct NvmlApi {
  int (*getHandleByPciBusId)(const char*, void**) = nullptr;
  int (*getNvLinkState)(void*, unsigned, int*) = nullptr;
  int (*getGpuFabricInfo)(void*, FabricInfo*) = nullptr;
  bool ok = false;
};

const NvmlApi& nvml_api() {
  static const NvmlApi api = [] {
    NvmlApi a;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return a;
    int (*init)() = nullptr;
    bind(lib, "nvmlInit_v2", init);
    bind(lib, "nvmlDeviceGetHandleByPciBusId_v2", a.getHandleByPciBusId);
    bind(lib, "nvmlDeviceGetNvLinkState", a.getNvLinkState);
    bind(lib, "nvmlDeviceGetGpuFabricInfo", a.getGpuFabricInfo);  // optional (newer drivers)
    a.ok = init && a.getHandleByPciBusId && a.getNvLinkState && init() == 0;
    return a;
  }();
  return api;
}

}  // namespace

int cuda_device_count() {
  const CudaApi& a = cuda_api();
  int n = 0;
  if (a.runtime) {
    if (a.getDeviceCount(&n) != 0) n = 0;
  } else if (a.driver) {
    if (a.cuDeviceGetCount(&n) != 0) n = 0;
  }
  return n;
}

NvlinkProbe probe_nvlink(int device) {
  NvlinkProbe p;
  if (device < 0) return p;
  const NvmlApi& nv = nvml_api();
  if (!nv.ok) return p;
  const std::string bus = pci_bus_id(device);
  void* handle = nullptr;
  if (bus.empty() || nv.getHandleByPciBusId(bus.c_str(), &handle) != 0) return p;
  p.nvml = true;
  for (unsigned link = 0; link < kMaxNvlinks; ++link) {
    int active = 0;
    if (nv.getNvLinkState(handle, link, &active) != 0) break;  // past the device's links
    if (active) ++p.active_links;
  }
  if (nv.getGpuFabricInfo) {
    FabricInfo f{};
    if (nv.getGpuFabricInfo(handle, &f) == 0 && f.state == kFabricStateCompleted && f.status == 0) {
      bool any = false;
      for (unsigned char b : f.cluster_uuid) any = any || b != 0;
      if (any) {
        char hex[40] = {0};
        for (int i = 0; i < 16; ++i) std::snprintf(hex + 2 * i, 3, "%02x", f.cluster_uuid[i]);
        p.fabric = std::string(hex) + ":" + std::to_string(f.clique_id);
      }
    }
  }
  return p;
}

}  // namespace trident
