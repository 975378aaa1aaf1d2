// The DeviceStaging of a Ctx's device (core/staging.hpp): which buffers are
// the device's, and the explicit copies a host transport stages them with.
#pragma once
#include <memory>

#include "trident/core/staging.hpp"
#include "trident/kernels/context.hpp"

namespace trident::kernels {

// For a device Ctx (emulated, cuda): copies ordered on ctx's stream (whose
// resources must outlive the copies); a wait for a copy (cuda) ends in a
// TimeoutError after timeout_s (runtime.timeout_s). For a host Ctx: null,
// since host buffers need no staging.
std::shared_ptr<DeviceStaging> device_staging(const Ctx& ctx, double timeout_s = 300.0);

}  // namespace trident::kernels
