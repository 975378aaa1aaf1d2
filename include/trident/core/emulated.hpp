// The emulated device's memory: a guarded arena that host code cannot read
// or write outside device operations.
//
// One virtual range is reserved per process (PROT_NONE); allocations are
// carved from it first-fit with a free list, each registered with its size,
// a serial number and the return addresses of the code that allocated it.
// The pages stay inaccessible except while a Guard is alive: the kernels
// layer takes one around every op and every explicit copy on the emulated
// device, so the CPU kernels run on it unchanged. A host access to arena
// memory anywhere else faults; the handler prints one line (the address, the
// allocation, the code that touched it and the code that allocated it) and
// ends the process with kFaultExitCode. Faults outside the arena keep the
// behaviour they had before (the previous handler, or the default).
//
// Protection is per process, so a Guard lifts it for every thread; trident's
// kernels run on the calling thread, and nothing else runs during an op.
#pragma once
#include <cstddef>
#include <cstdint>

#include "trident/core/allocator.hpp"

namespace trident::emulated {

// The exit status of a process stopped by a host access to emulated device
// memory (distinct from trident's 0, 1 and 2; documented in faults.md).
inline constexpr int kFaultExitCode = 86;

// Size of the reserved range: TRIDENT_EMULATED_ARENA_MB (MiB) when set, else
// 64 GiB of address space. Only pages that have been allocated are ever made
// accessible, so the reservation costs no memory.
size_t arena_capacity();

// The allocator of the emulated device (created on first use, which also
// installs the fault handler). Aligns to 256 bytes, as CUDA does.
Allocator& allocator();

// Whether p points into the arena (false before the arena exists).
bool contains(const void* p);

// Arena memory is readable and writable while at least one Guard is alive
// (guards nest). Cheap when nested; the outermost one costs two mprotect
// calls over the part of the arena in use. A no-op before the arena exists.
class Guard {
 public:
  Guard();
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

 private:
  bool lifted_ = false;  // whether this guard lifted (the arena existed then)
};

// Whether a Guard is alive (device memory is accessible now).
bool guard_lifted();

// The emulated device's illegal-address fault for the other direction: an
// op on the device given a host pointer (which a GPU kernel could not read)
// prints one line naming the op, the argument and its caller, and ends the
// process with kFaultExitCode. Called by the kernels' routing.
[[noreturn]] void host_argument(const char* op, int index, const void* p);

}  // namespace trident::emulated
