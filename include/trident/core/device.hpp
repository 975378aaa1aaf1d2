// Device and DType: where a buffer lives and what its elements are.
//
// A Device is a value (cpu, or cuda:N); a DType names the element type of a
// buffer. Both are recorded in the run file, so their names are part of the
// HDF5 contract ("cpu", "cuda:0"; "f32", "bf16", "i32", "i64").
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace trident {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // cuda:N ordinal; 0 for the host

  static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
  static constexpr Device cuda(int i) { return {DeviceType::cuda, i}; }
  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  constexpr bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu" | "cuda:N"
};

enum class DType : uint8_t { f32, bf16, i32, i64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}
const char* dtype_name(DType t);  // "f32" | "bf16" | "i32" | "i64"

}  // namespace trident
