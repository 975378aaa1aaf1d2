// Out-of-line error helpers.
#include "trident/core/error.hpp"

namespace trident {

void throw_error(const char* file, int line, const std::string& msg) {
  std::string f = file;
  if (auto p = f.rfind("/src/"); p != std::string::npos) f = f.substr(p + 1);
  else if (auto k = f.rfind("/kernels/"); k != std::string::npos) f = f.substr(k + 1);
  throw Error(f + ":" + std::to_string(line) + ": " + msg);
}

}  // namespace trident
