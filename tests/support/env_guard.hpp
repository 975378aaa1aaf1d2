// Restores an environment variable at scope exit (tests that set
// TRIDENT_DEVICE, TRIDENT_TOPOLOGY, ...): its old value, or unset.
#pragma once
#include <cstdlib>
#include <string>

namespace trident::testing {

struct EnvGuard {
  explicit EnvGuard(const char* name) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v, had_ = true;
  }
  ~EnvGuard() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace trident::testing
