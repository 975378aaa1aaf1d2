// Tensor: a dense, row-major view of typed elements in reference-counted
// storage on one device.
//
// Storage comes from the Allocator of its device (cpu_allocator(), or the
// CUDA backend's caching allocator), so every tensor of a rank is counted in
// that allocator's bytes in use and peak: the figure the run file records and
// the planner predicts. A Tensor is a handle, as in PyTorch: copying one
// shares the storage, and view() / rows() / reshape() describe part of it
// (offset + shape) without copying. clone() copies the elements.
//
// Element access through ptr() / data<T>() is allowed on every device (the
// pointer is then a device pointer, for kernels); operator[], fill and clone
// touch memory from the host and are host-only. Copies between devices and
// fills of device memory go through the kernels (kernels/tensor_ops.hpp).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trident/core/allocator.hpp"
#include "trident/core/device.hpp"

namespace trident {

// One allocation of one device, freed into its allocator with the last
// Tensor that refers to it; or memory borrowed from its owner (no
// allocator: never freed here, counted where it was allocated).
class Storage {
 public:
  Storage(Allocator& alloc, size_t bytes);
  Storage(void* borrowed, size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return alloc_ ? alloc_->device() : device_; }

 private:
  Allocator* alloc_;
  size_t bytes_;
  void* ptr_;
  Device device_;
};

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<uint16_t>() {
  return DType::bf16;
}  // bf16 bits
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}

class Tensor {
 public:
  Tensor() = default;
  // f32 on the host, every element `fill`.
  explicit Tensor(std::vector<int64_t> shape, float fill = 0.0f);
  // Uninitialised elements from `alloc` (the device is the allocator's).
  static Tensor empty(std::vector<int64_t> shape, Allocator& alloc = cpu_allocator(),
                      DType dtype = DType::f32);

  // A tensor over memory its caller owns and keeps alive while the tensor
  // (and every view of it) is in use: `shape` elements of `dtype` at `data`
  // on `device`. Nothing is allocated, copied, counted or freed. For callers
  // that hold raw buffers (tests, benches, a pointer API's adapter) and hand
  // them to tensor code; a tensor op may write the elements, so a read-only
  // buffer must only be passed where the op reads.
  static Tensor borrow(void* data, std::vector<int64_t> shape, Device device,
                       DType dtype = DType::f32);

  // A new host tensor with the same shape, dtype and elements (host only).
  Tensor clone() const;
  // `shape` elements starting `offset` elements into this view; shares storage.
  Tensor view(int64_t offset, std::vector<int64_t> shape) const;
  // Rows [begin, end) of dimension 0; shares storage.
  Tensor rows(int64_t begin, int64_t end) const;
  // The same elements under another shape of equal numel; shares storage.
  Tensor reshape(std::vector<int64_t> shape) const;

  const std::vector<int64_t>& shape() const { return shape_; }
  static int64_t numel_of(const std::vector<int64_t>& s);
  int64_t numel() const { return numel_; }
  int64_t dim(int i) const { return shape_.at(size_t(i < 0 ? int(shape_.size()) + i : i)); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  DType dtype() const { return dtype_; }
  Device device() const;
  size_t bytes() const { return size_t(numel_) * dtype_size(dtype_); }
  bool empty() const { return numel_ == 0; }
  // True when both refer to the same storage (views of one allocation).
  bool shares_storage_with(const Tensor& o) const { return storage_ && storage_ == o.storage_; }

  // Typed pointer to the first element (a device pointer off the host);
  // throws when T is not the tensor's dtype.
  template <class T>
  T* data() const {
    check_dtype(dtype_of<T>());
    return base<T>();
  }
  // The first element's address whatever the dtype (for copies and transfers).
  void* data_ptr() const { return base<char>(); }
  float* ptr() { return data<float>(); }
  const float* ptr() const { return data<float>(); }

  // Host-only element access and fills.
  float& operator[](int64_t i) { return host_f32()[i]; }
  float operator[](int64_t i) const { return host_f32()[i]; }
  // The f32 elements as a host span (host only).
  std::span<float> values() const { return {host_f32(), size_t(numel_)}; }
  void fill(float value);
  void zero() { fill(0.0f); }
  std::string shape_str() const;

 private:
  template <class T>
  T* base() const {
    return storage_ ? reinterpret_cast<T*>(static_cast<char*>(storage_->data()) +
                                           size_t(offset_) * dtype_size(dtype_))
                    : nullptr;
  }
  float* host_f32() const;
  void check_dtype(DType want) const;

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // elements from the storage's start
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

// Largest |a-b| / max(|b|, floor) over all elements; used by parity tests.
double max_rel_diff(const float* a, const float* b, int64_t n, double floor = 1e-6);
inline double max_rel_diff(const Tensor& a, const Tensor& b, double floor = 1e-6) {
  return max_rel_diff(a.ptr(), b.ptr(), a.numel(), floor);
}
// ||a-b|| / ||b|| (Frobenius): the tolerance measure for whole tensors.
double rel_l2_diff(const float* a, const float* b, int64_t n);
inline double rel_l2_diff(const Tensor& a, const Tensor& b) {
  return rel_l2_diff(a.ptr(), b.ptr(), a.numel());
}

}  // namespace trident
