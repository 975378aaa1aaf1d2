// Comma-separated list flags of the bench commands.
#include "list_flags.hpp"

#include "trident/bench/engine.hpp"
#include "trident/core/error.hpp"

namespace trident::cli {

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> items = bench::split_list(text);
  if (items.empty()) throw InputError(flag + " '" + text + "': give at least one value");
  return items;
}

std::vector<int64_t> parse_positive_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(flag, text)) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v <= 0)
      throw InputError(flag + " " + text + ": '" + item + "' is not a positive integer");
    out.push_back(v);
  }
  return out;
}

}  // namespace trident::cli
