// The registry of device buffers in use by other streams (buffer_uses.hpp).
#include "trident/kernels/buffer_uses.hpp"

#include <chrono>
#include <string>
#include <thread>

#include "trident/core/clock.hpp"
#include "trident/core/error.hpp"

namespace trident::kernels {

void BufferUses::record(const void* p, size_t bytes, std::shared_ptr<UseFence> fence) {
  if (!p || bytes == 0) return;
  const auto b = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(m_);
  // Uses already over go first, so the list stays as long as what is in flight.
  std::erase_if(uses_, [](Use& u) { return u.fence->done(); });
  uses_.push_back({b, b + bytes, std::move(fence)});
}

void BufferUses::before_free(const void* p, size_t bytes, void* stream, double timeout_s) {
  if (!p || bytes == 0) return;
  const auto b = reinterpret_cast<uintptr_t>(p), e = b + bytes;
  std::vector<std::shared_ptr<UseFence>> pending;
  {
    std::lock_guard<std::mutex> lock(m_);
    std::erase_if(uses_, [&](Use& u) {
      if (u.fence->done()) return true;
      if (u.begin >= e || b >= u.end) return false;
      pending.push_back(u.fence);
      return true;
    });
  }
  // Outside the lock: a host wait lets the ranks that complete the use
  // record theirs meanwhile.
  for (auto& f : pending) f->order_before(stream, timeout_s);
}

size_t BufferUses::recorded() {
  std::lock_guard<std::mutex> lock(m_);
  std::erase_if(uses_, [](Use& u) { return u.fence->done(); });
  return uses_.size();
}

BufferUses& buffer_uses() {
  static BufferUses uses;
  return uses;
}

void wait_for_fence(UseFence& f, double timeout_s, const char* what) {
  const double t0 = monotonic_s();
  while (!f.done()) {
    if (monotonic_s() - t0 > timeout_s)
      throw TimeoutError(std::string(what) + ": a buffer's pending use did not end within " +
                         std::to_string(timeout_s) + " s");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace trident::kernels
