// Device buffers in use by work that their allocator's stream does not order:
// a communicator's pending operations, which run on its own stream (NCCL).
// The communicator records each use with a fence when it posts; an
// allocator asks before it frees, so a buffer handed to a pending
// communication outlives it. On a GPU the allocator's stream waits (on the
// device, no host block) for the operation's event before the free, so the
// stream-ordered pool cannot hand the memory to a new allocation before the
// operation is done with it, whether its request was waited for, released
// by an exception, or not yet waited for. On the host the free waits, with a
// deadline. Host-side code only (no CUDA header).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace trident::kernels {

// The end of one recorded use.
class UseFence {
 public:
  virtual ~UseFence() = default;
  // Whether the use is over; never blocks.
  virtual bool done() = 0;
  // Orders `stream`'s later work after the use (a device: the stream waits
  // for the use's event, the host does not block). A null stream: the host
  // waits until done, at most timeout_s, then TimeoutError.
  virtual void order_before(void* stream, double timeout_s) = 0;
};

class BufferUses {
 public:
  // [p, p + bytes) is in use until `fence` is done.
  void record(const void* p, size_t bytes, std::shared_ptr<UseFence> fence);
  // Before [p, p + bytes) is freed on `stream` (null: by the host): every
  // use of it not yet done is ordered before what follows on the stream (the
  // free), and forgotten. Uses found done on the way are dropped.
  void before_free(const void* p, size_t bytes, void* stream, double timeout_s = 300.0);
  // Uses recorded and not over yet (tests).
  size_t recorded();

 private:
  struct Use {
    uintptr_t begin, end;
    std::shared_ptr<UseFence> fence;
  };
  std::mutex m_;
  std::vector<Use> uses_;
};

// The process's registry (one per process, as the CUDA context is).
BufferUses& buffer_uses();

// The host's fence wait: polls done() until it holds or timeout_s passes
// (TimeoutError naming `what`).
void wait_for_fence(UseFence& f, double timeout_s, const char* what);

}  // namespace trident::kernels
