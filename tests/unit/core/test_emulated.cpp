// The emulated device's arena: host code outside a Guard cannot touch its
// memory (the process ends with one line and kFaultExitCode), code inside a
// Guard can; allocations are reused after a free and counted like every
// allocator's. The faulting accesses run in a forked child.
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <string>

#include "trident/core/emulated.hpp"
#include "trident/core/tensor.hpp"

using namespace trident;

namespace {

struct ChildEnd {
  int status = 0;
  std::string err;  // what the child wrote to stderr
};

// Runs body in a child process with stderr captured; body returning means
// the child exits 0.
template <class F>
ChildEnd in_child(F body) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    body();
    _exit(0);
  }
  close(fds[1]);
  ChildEnd end;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) end.err.append(buf, size_t(n));
  close(fds[0]);
  REQUIRE(waitpid(pid, &end.status, 0) == pid);
  return end;
}

std::string hex(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%#lx", static_cast<unsigned long>(reinterpret_cast<uintptr_t>(p)));
  return b;
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("emulated memory is usable inside a guard and keeps its bytes", "[emulated]") {
  Allocator& a = emulated::allocator();
  CHECK(a.device() == Device::emulated());
  CHECK(a.device().str() == "emulated:0");
  auto* p = static_cast<int*>(a.allocate(1000 * sizeof(int)));
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
  CHECK(emulated::contains(p));
  CHECK_FALSE(emulated::contains(&a));
  CHECK_FALSE(emulated::guard_lifted());
  {
    emulated::Guard g;
    CHECK(emulated::guard_lifted());
    { emulated::Guard nested; }
    CHECK(emulated::guard_lifted());  // the inner guard leaves the outer one's access
    for (int i = 0; i < 1000; ++i) p[i] = 3 * i + 1;
  }
  CHECK_FALSE(emulated::guard_lifted());
  long sum = 0;
  {
    emulated::Guard g;
    for (int i = 0; i < 1000; ++i) sum += p[i];
  }
  CHECK(sum == 3L * 999 * 1000 / 2 + 1000);
  a.deallocate(p, 1000 * sizeof(int));
}

TEST_CASE("a host write outside a guard ends the process with one line", "[emulated]") {
  Allocator& a = emulated::allocator();
  auto* p = static_cast<char*>(a.allocate(4096));
  const ChildEnd end = in_child([&] { static_cast<volatile char*>(p)[100] = 7; });
  REQUIRE(WIFEXITED(end.status));
  CHECK(WEXITSTATUS(end.status) == emulated::kFaultExitCode);
  INFO(end.err);
  CHECK(count_lines(end.err) == 1);
  CHECK(end.err.rfind("trident: emulated device: host access to device memory at " + hex(p + 100) +
                          " (outside a device operation, byte 100 of allocation #",
                      0) == 0);
  CHECK(end.err.find(": 4096 B at arena offset ") != std::string::npos);
  CHECK(end.err.find("allocated at ") != std::string::npos);
  CHECK(end.err.find("); accessed by ") != std::string::npos);
  a.deallocate(p, 4096);
}

TEST_CASE("a host read outside a guard ends the process, inside one it succeeds", "[emulated]") {
  Allocator& a = emulated::allocator();
  auto* p = static_cast<float*>(a.allocate(64 * sizeof(float)));
  {
    emulated::Guard g;
    p[63] = 2.5f;
  }
  const ChildEnd bad = in_child([&] {
    const float x = static_cast<volatile float*>(p)[63];
    std::fprintf(stderr, "read %g\n", double(x));
  });
  REQUIRE(WIFEXITED(bad.status));
  CHECK(WEXITSTATUS(bad.status) == emulated::kFaultExitCode);
  CHECK(bad.err.find(hex(p + 63)) != std::string::npos);
  CHECK(bad.err.find("read ") == std::string::npos);
  const ChildEnd good = in_child([&] {
    emulated::Guard g;
    const float x = static_cast<volatile float*>(p)[63];
    std::fprintf(stderr, "read %g\n", double(x));
  });
  REQUIRE(WIFEXITED(good.status));
  CHECK(WEXITSTATUS(good.status) == 0);
  CHECK(good.err == "read 2.5\n");
  a.deallocate(p, 64 * sizeof(float));
}

TEST_CASE("a fault outside the arena keeps its usual behaviour", "[emulated]") {
  emulated::allocator();  // the handler is installed
  const ChildEnd crash = in_child([] {
    struct sigaction dfl {};  // what a process without a test framework has
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGSEGV, &dfl, nullptr);
    { emulated::Guard g; }  // the guard's end puts on_fault back, over SIG_DFL
    // a page that no mapping covers (munmapped here), outside the arena
    void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(page, 4096);
    *static_cast<volatile int*>(page) = 1;
  });
  REQUIRE(WIFSIGNALED(crash.status));
  CHECK(WTERMSIG(crash.status) == SIGSEGV);
  CHECK(crash.err.find("emulated device") == std::string::npos);
}

TEST_CASE("freed emulated memory is reused and counted", "[emulated]") {
  Allocator& a = emulated::allocator();
  const size_t base_use = a.bytes_in_use();
  a.reset_peak();
  void* x = a.allocate(1000);
  void* y = a.allocate(3000);
  CHECK(a.bytes_in_use() == base_use + 4000);
  CHECK(a.peak_bytes() == base_use + 4000);
  a.deallocate(x, 1000);
  CHECK(a.bytes_in_use() == base_use + 3000);
  void* z = a.allocate(900);  // fits the freed 1024-byte block
  CHECK(z == x);
  a.deallocate(z, 900);
  a.deallocate(y, 3000);
  CHECK(a.bytes_in_use() == base_use);
  CHECK(a.peak_bytes() == base_use + 4000);
  // the two freed blocks merge: one allocation of both sizes fits where x was
  void* w = a.allocate(1024 + 3072);
  CHECK(w == x);
  a.deallocate(w, 1024 + 3072);
  CHECK(a.allocate(0) == nullptr);
}

TEST_CASE("a tensor on the emulated device refuses host element access", "[emulated]") {
  Tensor t = Tensor::empty({4, 8}, emulated::allocator());
  CHECK(t.device() == Device::emulated());
  CHECK(emulated::contains(t.data_ptr()));
  CHECK_THROWS_WITH(t[0], Catch::Contains("host element access to a emulated:0 tensor"));
}
