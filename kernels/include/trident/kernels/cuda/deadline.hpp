// Waiting for the device with a deadline. Every blocking wait on the GPU
// (an event, a stream) polls a readiness query instead of calling the
// blocking CUDA function, so a hung kernel or peer ends in a TimeoutError
// naming what was awaited instead of a process that never returns. Plain C++:
// the polling logic is unit-tested on the CPU with a fake query.
#pragma once
#include <chrono>
#include <string>
#include <thread>

#include "trident/core/error.hpp"

namespace trident::kernels::cuda {

// Polls ready() until it returns true or timeout_s seconds have passed, then
// throws TimeoutError("<what>: not complete after <timeout_s> s"). The first
// polls spin (short kernels finish in microseconds), later ones sleep up to
// max_sleep so that a long wait does not burn a core.
template <class Ready>
void wait_until(Ready&& ready, double timeout_s, const std::string& what,
                std::chrono::microseconds max_sleep = std::chrono::microseconds(200)) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  auto sleep = std::chrono::microseconds(1);
  for (int polls = 0;; ++polls) {
    if (ready()) return;
    if (clock::now() >= deadline)
      throw TimeoutError(what + ": not complete after " + std::to_string(timeout_s) + " s");
    if (polls < 64) continue;
    std::this_thread::sleep_for(sleep);
    if (sleep < max_sleep) sleep *= 2;
  }
}

}  // namespace trident::kernels::cuda
