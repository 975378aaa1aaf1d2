// Device probes used by topology detection: CUDA device count and NVLink
// facts, loaded with dlopen at run time so that one binary runs on machines
// with and without a GPU driver. No MPI here (callable from a bare probe).
#pragma once
#include <string>

namespace trident {

// Visible CUDA devices (libcudart, else the driver's libcuda); 0 when no
// library or no device is found.
int cuda_device_count();

struct NvlinkProbe {
  bool nvml = false;     // libnvidia-ml.so.1 loaded and initialised
  int active_links = 0;  // NVLinks of this device in the active state
  std::string fabric;    // "<clusterUuid hex>:<cliqueId>" for multi-node NVLink, else ""
  int island = 0;        // GPUs of this node in this device's NVLink island (0: unknown)
};

// NVLink facts of CUDA device `device` (index as CUDA enumerates it; NVML's
// handle is found by the device's PCI bus id, so CUDA_VISIBLE_DEVICES and
// CUDA_DEVICE_ORDER do not matter). device < 0: nothing to probe.
NvlinkProbe probe_nvlink(int device);

}  // namespace trident
