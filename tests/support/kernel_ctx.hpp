// The Ctx that tests run kernels with: a host DeviceContext (with its
// workspace, as a training stage has), one per test process.
#pragma once
#include "trident/kernels/backend.hpp"

namespace trident::test {

inline const kernels::Ctx& kernel_ctx() {
  static kernels::DeviceContext device(Device::cpu());
  return device.ctx();
}

}  // namespace trident::test
