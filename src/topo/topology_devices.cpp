// CUDA and NVML probes for topology detection, through dlopen: the CPU build
// and CPU machines need neither library, and a GPU node's driver provides
// them at run time (NVML's header is not even part of the CUDA toolkit).
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

#include "trident/kernels/backend.hpp"
#include "trident/topo/devices.hpp"
#include "trident/topo/nvlink.hpp"

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

// nvmlPciInfo_t (nvml.h): only busId is read.
struct PciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
// nvmlIntNvLinkDeviceType_t values
constexpr int kRemoteGpu = 0, kRemoteSwitch = 2;

struct NvmlApi {
  int (*getHandleByPciBusId)(const char*, void**) = nullptr;
  int (*getNvLinkState)(void*, unsigned, int*) = nullptr;
  int (*getGpuFabricInfo)(void*, FabricInfo*) = nullptr;
  // For the node's NVLink islands (optional: without them, active links only).
  int (*getCount)(unsigned*) = nullptr;
  int (*getHandleByIndex)(unsigned, void**) = nullptr;
  int (*getPciInfo)(void*, PciInfo*) = nullptr;
  int (*getRemotePciInfo)(void*, unsigned, PciInfo*) = nullptr;
  int (*getRemoteDeviceType)(void*, unsigned, int*) = nullptr;
  bool ok = false;
  bool islands() const {
    return getCount && getHandleByIndex && getPciInfo && getRemotePciInfo && getRemoteDeviceType;
  }
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
    bind(lib, "nvmlDeviceGetCount_v2", a.getCount);
    bind(lib, "nvmlDeviceGetHandleByIndex_v2", a.getHandleByIndex);
    bind(lib, "nvmlDeviceGetPciInfo_v3", a.getPciInfo);
    bind(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2", a.getRemotePciInfo);
    bind(lib, "nvmlDeviceGetNvLinkRemoteDeviceType", a.getRemoteDeviceType);
    a.ok = init && a.getHandleByPciBusId && a.getNvLinkState && init() == 0;
    return a;
  }();
  return api;
}

// Every GPU of the node as NVML enumerates it, with where its active links go.
std::vector<NvlinkDevice> probe_node_links(const NvmlApi& nv) {
  std::vector<NvlinkDevice> devices;
  unsigned count = 0;
  if (!nv.islands() || nv.getCount(&count) != 0) return devices;
  for (unsigned i = 0; i < count; ++i) {
    void* h = nullptr;
    PciInfo pci{};
    if (nv.getHandleByIndex(i, &h) != 0 || nv.getPciInfo(h, &pci) != 0) return {};
    NvlinkDevice d;
    d.bus_id = canonical_bus_id(pci.bus_id);
    for (unsigned link = 0; link < kMaxNvlinks; ++link) {
      int active = 0, type = -1;
      if (nv.getNvLinkState(h, link, &active) != 0) break;  // past the device's links
      if (!active || nv.getRemoteDeviceType(h, link, &type) != 0) continue;
      PciInfo remote{};
      if (type == kRemoteSwitch) ++d.switch_links;
      if (type == kRemoteGpu && nv.getRemotePciInfo(h, link, &remote) == 0)
        d.gpu_peers.push_back(canonical_bus_id(remote.bus_id));
    }
    devices.push_back(std::move(d));
  }
  return devices;
}

// Devices in the NVLink island of the GPU with PCI bus id `bus`; 0 unknown.
int island_of(const NvmlApi& nv, const std::string& bus) {
  const std::vector<NvlinkDevice> devices = probe_node_links(nv);
  const std::string want = canonical_bus_id(bus);
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i].bus_id == want) return nvlink_island_size(devices, int(i));
  return 0;
}

}  // namespace

int cuda_device_count() {
  // A test standing in for a node's GPUs (kernels::DeviceRuntime) decides.
  if (kernels::device_runtime_is_fake()) return kernels::device_runtime().count();
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
    if (nv.getGpuFabricInfo(handle, &f) == 0 && f.state == kFabricStateCompleted && f.status == 0)
      p.fabric = fabric_label(f.cluster_uuid, f.clique_id);
  }
  p.island = island_of(nv, bus);
  return p;
}

}  // namespace trident
