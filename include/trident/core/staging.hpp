// DeviceStaging: how a host transport reaches the buffers of a device it
// cannot read (a GPU whose memory MPI is not given, the emulated device):
// which buffers live there, and the explicit copies to and from host memory.
//
// The kernels layer makes one from a stage's Ctx (kernels/staging.hpp); the
// MPI communicator takes it (Communicator::stage_device_buffers) and copies
// every device buffer of an operation through host memory: in before the
// operation is posted, out when it completes. A copy to the host returns
// when the data is there (ordered after the work queued on the Ctx so far);
// a copy to the device is queued in the same order and may still run after
// it returns, reading a host buffer from host_buffer (which keeps it until
// then) or pageable memory (which the copy has read before it returns).
#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "trident/core/device.hpp"

namespace trident {

// A host buffer for staging; destroying it frees it or hands it back.
using HostBuffer = std::unique_ptr<char, std::function<void(char*)>>;

class DeviceStaging {
 public:
  virtual ~DeviceStaging() = default;
  // A host buffer of at least `bytes` for this device's copies: plain host
  // memory here; a GPU's pinned memory, reused (kernels/cuda/pinned_pool.hpp).
  virtual HostBuffer host_buffer(size_t bytes) {
    return HostBuffer(new char[bytes], [](char* p) { delete[] p; });
  }
  virtual Device device() const = 0;
  // Whether p points into this device's memory (host pointers: false).
  virtual bool on_device(const void* p) const = 0;
  virtual void to_host(void* host, const void* dev, size_t bytes) = 0;
  virtual void to_device(void* dev, const void* host, size_t bytes) = 0;
};

}  // namespace trident
