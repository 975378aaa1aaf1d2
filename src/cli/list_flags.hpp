// Comma-separated list flags of the bench commands ("--seq 1024,4096"):
// parsed in one place so every bench reports a bad list the same way
// (InputError naming the flag: exit 2).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace trident::cli {

// "a,b,c" -> {"a","b","c"}; an empty list is an InputError naming flag.
std::vector<std::string> split_list(const std::string& flag, const std::string& text);
// Every item a positive integer, or an InputError naming flag and the item.
std::vector<int64_t> parse_positive_list(const std::string& flag, const std::string& text);

}  // namespace trident::cli
