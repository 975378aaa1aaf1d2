// DeviceStaging: how a host transport reaches the buffers of a device it
// cannot read (a GPU whose memory MPI is not given, the emulated device):
// which buffers live there, and the explicit copies to and from host memory.
//
// The kernels layer makes one from a stage's Ctx (kernels/staging.hpp); the
// MPI communicator takes it (Communicator::stage_device_buffers) and copies
// every device buffer of an operation through host memory: in before the
// operation is posted, out when it completes. Copies wait for the data
// (ordered after the work queued on the Ctx so far).
#pragma once
#include <cstddef>

#include "trident/core/device.hpp"

namespace trident {

class DeviceStaging {
 public:
  virtual ~DeviceStaging() = default;
  virtual Device device() const = 0;
  // Whether p points into this device's memory (host pointers: false).
  virtual bool on_device(const void* p) const = 0;
  virtual void to_host(void* host, const void* dev, size_t bytes) = 0;
  virtual void to_device(void* dev, const void* host, size_t bytes) = 0;
};

}  // namespace trident
