// The emulated device's guarded arena, its Guard and its fault handler (see
// core/emulated.hpp).
#include "trident/core/emulated.hpp"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "trident/core/error.hpp"

namespace trident::emulated {
namespace {

constexpr size_t kAlign = 256;
constexpr int kFrames = 8;      // allocating call chain kept per allocation
constexpr int kSkipFrames = 1;  // Arena::allocate itself

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

void install_handler();

// One live allocation: what the fault line says about it.
struct Block {
  size_t size = 0;
  uint64_t serial = 0;
  int n_frames = 0;
  void* frames[kFrames] = {};
};

class Arena final : public Allocator {
 public:
  Arena() : page_(size_t(sysconf(_SC_PAGESIZE))), cap_(round_up(arena_capacity(), page_)) {
    void* p = mmap(nullptr, cap_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw Error("emulated device: cannot reserve " + std::to_string(cap_ >> 20) +
                  " MiB of address space for its arena (" + std::strerror(errno) +
                  "; set TRIDENT_EMULATED_ARENA_MB lower)");
    base_ = static_cast<char*>(p);
  }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    const size_t size = round_up(bytes, kAlign);
    std::lock_guard<std::mutex> lock(mu_);
    const size_t off = take(size, bytes);
    Block& b = live_[off];
    b.size = size;
    b.serial = ++serial_;
    void* frames[kFrames + kSkipFrames];
    const int n = backtrace(frames, kFrames + kSkipFrames);
    for (int i = kSkipFrames; i < n; ++i) b.frames[b.n_frames++] = frames[i];
    count_alloc(base_ + off, bytes);
    install_handler();
    return base_ + off;
  }

  void deallocate(void* p, size_t bytes) noexcept override {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    const size_t off = size_t(static_cast<char*>(p) - base_);
    auto it = live_.find(off);
    if (it == live_.end()) {
      std::fprintf(stderr, "trident: emulated device: free of %p, which is no live allocation\n",
                   p);
      std::abort();
    }
    give_back(off, it->second.size);
    live_.erase(it);
    count_free(p, bytes);
  }

  Device device() const override { return Device::emulated(); }

  bool contains(uintptr_t a) const {
    const auto b = reinterpret_cast<uintptr_t>(base_);
    return a >= b && a < b + cap_;
  }

  void lift() {
    std::lock_guard<std::mutex> lock(mu_);
    if (depth_++ == 0) protect(0, mapped_, PROT_READ | PROT_WRITE);
  }
  void drop() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--depth_ > 0) return;
    protect(0, mapped_, PROT_NONE);
    install_handler();
  }
  bool lifted() const { return depth_ > 0; }

  // For the fault handler (no locks: the process ends right after).
  const Block* block_at(size_t off, size_t& start) const {
    auto it = live_.upper_bound(off);
    if (it == live_.begin()) return nullptr;
    --it;
    if (off >= it->first + it->second.size) return nullptr;
    start = it->first;
    return &it->second;
  }
  uintptr_t base() const { return reinterpret_cast<uintptr_t>(base_); }

 private:
  // An offset of `size` free bytes: the first free block that fits, else
  // the end of the used part (made accessible as the guard says).
  size_t take(size_t size, size_t asked) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const size_t off = it->first, rest = it->second - size;
      free_.erase(it);
      if (rest) free_.emplace(off + size, rest);
      return off;
    }
    if (size > cap_ - used_)
      throw Error("emulated device: out of memory allocating " + std::to_string(asked) +
                  " bytes (" + std::to_string(bytes_in_use()) + " in use in an arena of " +
                  std::to_string(cap_ >> 20) + " MiB; TRIDENT_EMULATED_ARENA_MB sets its size)");
    const size_t off = used_;
    used_ += size;
    if (used_ > mapped_) {
      const size_t grown = round_up(used_, page_);
      if (depth_ > 0) protect(mapped_, grown - mapped_, PROT_READ | PROT_WRITE);
      mapped_ = grown;
    }
    return off;
  }

  // Returns [off, off+size) to the free list, merged with its neighbours;
  // a block that reaches the end of the used part shortens it instead.
  void give_back(size_t off, size_t size) {
    auto next = free_.lower_bound(off);
    if (next != free_.end() && next->first == off + size) {
      size += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        off = prev->first;
        size += prev->second;
        free_.erase(prev);
      }
    }
    if (off + size == used_)
      used_ = off;
    else
      free_.emplace(off, size);
  }

  void protect(size_t off, size_t len, int prot) {
    if (len == 0) return;
    if (mprotect(base_ + off, len, prot) != 0) {
      std::fprintf(stderr, "trident: emulated device: mprotect of %zu bytes failed: %s\n", len,
                   std::strerror(errno));
      std::abort();
    }
  }

  const size_t page_, cap_;
  char* base_ = nullptr;
  size_t used_ = 0;    // end of the carved part
  size_t mapped_ = 0;  // end of the part the guard toggles (page multiple)
  std::atomic<int> depth_{0};
  uint64_t serial_ = 0;
  std::map<size_t, size_t> free_;  // offset -> bytes, below used_
  std::map<size_t, Block> live_;   // offset -> allocation
  std::mutex mu_;
};

std::atomic<Arena*> g_arena{nullptr};
struct sigaction g_old_segv, g_old_bus;

// "libfoo.so+0x1234" (or "symbol+0x12" where the dynamic symbol is known)
// for a code address, appended to buf.
void describe_code(char* buf, size_t cap, uintptr_t pc) {
  Dl_info info{};
  const size_t len = std::strlen(buf);
  if (len >= cap) return;
  if (dladdr(reinterpret_cast<void*>(pc), &info) == 0 || !info.dli_fname) {
    std::snprintf(buf + len, cap - len, "%#lx", static_cast<unsigned long>(pc));
    return;
  }
  if (info.dli_sname && info.dli_saddr) {
    std::snprintf(buf + len, cap - len, "%s+%#lx", info.dli_sname,
                  static_cast<unsigned long>(pc - reinterpret_cast<uintptr_t>(info.dli_saddr)));
    return;
  }
  const char* name = std::strrchr(info.dli_fname, '/');
  std::snprintf(buf + len, cap - len, "%s+%#lx", name ? name + 1 : info.dli_fname,
                static_cast<unsigned long>(pc - reinterpret_cast<uintptr_t>(info.dli_fbase)));
}

uintptr_t fault_pc(void* uctx) {
  const auto* uc = static_cast<const ucontext_t*>(uctx);
#if defined(__x86_64__)
  return uintptr_t(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return uintptr_t(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

void append(char* buf, size_t cap, const char* fmt, unsigned long a = 0, unsigned long b = 0,
            unsigned long c = 0, unsigned long d = 0) {
  const size_t len = std::strlen(buf);
  if (len < cap) std::snprintf(buf + len, cap - len, fmt, a, b, c, d);
}

// Ends the line with the hint that names the code, writes it (one write,
// async-signal-safe) and ends the process with kFaultExitCode.
[[noreturn]] void end_process(char* line, size_t cap) {
  append(line, cap, " (addr2line -Cfpe BINARY OFFSET names the code)\n");
  line[cap - 2] = '\n';
  const ssize_t written = write(STDERR_FILENO, line, std::strlen(line));
  (void)written;
  _exit(kFaultExitCode);
}

void on_fault(int sig, siginfo_t* info, void* uctx) {
  Arena* arena = g_arena.load();
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  if (!arena || !arena->contains(addr)) {
    // Not ours: the behaviour before the arena existed.
    sigaction(sig, sig == SIGBUS ? &g_old_bus : &g_old_segv, nullptr);
    if (info->si_code <= 0) raise(sig);  // sent, not a fault: send it again
    return;                              // a fault: the instruction faults again
  }
  char line[1536] = {};
  append(line, sizeof line, "trident: emulated device: host access to device memory at %#lx ",
         addr);
  append(line, sizeof line,
         arena->lifted() ? "(inside a device operation, " : "(outside a device operation, ");
  const size_t off = addr - arena->base();
  size_t start = 0;
  if (const Block* b = arena->block_at(off, start)) {
    append(line, sizeof line,
           "byte %lu of allocation #%lu: %lu B at arena offset %#lx, allocated at ", off - start,
           b->serial, b->size, start);
    for (int i = 0; i < b->n_frames; ++i) {
      if (i) append(line, sizeof line, " < ");
      describe_code(line, sizeof line, reinterpret_cast<uintptr_t>(b->frames[i]) - 1);
    }
  } else {
    append(line, sizeof line, "arena offset %#lx, in no live allocation", off);
  }
  append(line, sizeof line, "); accessed by ");
  // the faulting instruction, then its callers (the unwinder steps over
  // the signal frame; libgcc is loaded since the allocations' backtraces)
  const uintptr_t pc = fault_pc(uctx);
  describe_code(line, sizeof line, pc);
  void* frames[24];
  const int n = backtrace(frames, 24);
  int at = 0;
  while (at < n && reinterpret_cast<uintptr_t>(frames[at]) != pc) ++at;
  for (int i = at + 1, shown = 0; i < n && shown < 4; ++i, ++shown) {
    append(line, sizeof line, " < ");
    describe_code(line, sizeof line, reinterpret_cast<uintptr_t>(frames[i]) - 1);
  }
  end_process(line, sizeof line);
}

// Installs on_fault for SIGSEGV and SIGBUS where it is not the handler now,
// keeping the one it replaces: a library (or a test framework) that installs
// its own handler after the arena exists does not silence the device.
void install_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  for (auto [sig, old] : {std::pair{SIGSEGV, &g_old_segv}, std::pair{SIGBUS, &g_old_bus}}) {
    struct sigaction now {};
    sigaction(sig, nullptr, &now);
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_fault) continue;
    sigaction(sig, &sa, old);
  }
}

Arena& arena() {
  static Arena* a = [] {
    auto* made = new Arena();  // lives until exit: the handler may need it at any time
    g_arena.store(made);
    install_handler();
    return made;
  }();
  return *a;
}

}  // namespace

size_t arena_capacity() {
  if (const char* v = std::getenv("TRIDENT_EMULATED_ARENA_MB")) {
    const long long mb = std::atoll(v);
    if (mb > 0) return size_t(mb) << 20;
  }
  return size_t(64) << 30;
}

Allocator& allocator() { return arena(); }

bool contains(const void* p) {
  const Arena* a = g_arena.load();
  return a && a->contains(reinterpret_cast<uintptr_t>(p));
}

Guard::Guard() {
  if (Arena* a = g_arena.load()) {
    a->lift();
    lifted_ = true;
  }
}

Guard::~Guard() {
  if (lifted_) g_arena.load()->drop();
}

bool guard_lifted() {
  const Arena* a = g_arena.load();
  return a && a->lifted();
}

void host_argument(const char* op, int index, const void* p) {
  char line[1024] = {};
  std::snprintf(line, sizeof line,
                "trident: emulated device: kernels::%s was given host memory at %p as its "
                "argument %d (a device kernel cannot read it); called from ",
                op, p, index);
  void* frames[12];
  const int n = backtrace(frames, 12);
  // frames[0] is this function, frames[1] the op's routing
  for (int i = 2, shown = 0; i < n && shown < 5; ++i, ++shown) {
    if (shown) append(line, sizeof line, " < ");
    describe_code(line, sizeof line, reinterpret_cast<uintptr_t>(frames[i]) - 1);
  }
  end_process(line, sizeof line);
}

}  // namespace trident::emulated
