// Out-of-line error helpers.
#include "trident/core/error.hpp"

namespace trident {

std::string source_place(const char* file, int line) {
  std::string f = file;
  if (auto p = f.rfind("/src/"); p != std::string::npos)
    f = f.substr(p + 1);
  else if (auto k = f.rfind("/kernels/"); k != std::string::npos)
    f = f.substr(k + 1);
  return f + ":" + std::to_string(line);
}

void throw_error(const char* file, int line, const std::string& msg) {
  throw Error(source_place(file, line) + ": " + msg);
}

}  // namespace trident
