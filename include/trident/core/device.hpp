// Device and DType: where a buffer lives and what its elements are.
//
// A Device is a value (cpu, cuda:N, or emulated:0); a DType names the element
// type of a buffer. Both are recorded in the run file, so their names are
// part of the HDF5 contract ("cpu", "cuda:0", "emulated:0"; "f32", "bf16",
// "i32", "i64").
//
// emulated is a host device whose memory host code cannot read or write
// outside device operations (core/emulated.hpp): it runs the CPU kernels and
// stands in for a GPU where none is, so that every host access of device
// memory stops the process. Only the host (cpu) is host-addressable.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace trident {

enum class DeviceType : uint8_t { cpu, cuda, emulated };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // cuda:N ordinal; 0 for the host and the emulated device

  static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
  static constexpr Device cuda(int i) { return {DeviceType::cuda, i}; }
  static constexpr Device emulated() { return {DeviceType::emulated, 0}; }
  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  constexpr bool is_emulated() const { return type == DeviceType::emulated; }
  constexpr bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu" | "cuda:N" | "emulated:0"
};

enum class DType : uint8_t { f32, bf16, i32, i64, f64 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::f64:
      return 8;
  }
  return 0;
}
const char* dtype_name(DType t);  // "f32" | "bf16" | "i32" | "i64" | "f64"

}  // namespace trident
