// Tensor: a dense, row-major float32 array on the host with a shape.
//
// Deliberately small: kernels take raw pointers and sizes; Tensor owns the
// storage and carries the shape so that layers can pass activations around.
// Device (CUDA) buffers live in kernels/cuda and are not Tensors.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace trident {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s, float fill = 0.0f) : shape(std::move(s)) {
    data.assign(static_cast<size_t>(numel_of(shape)), fill);
  }

  static int64_t numel_of(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (auto d : s) n *= d;
    return n;
  }
  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  int64_t dim(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  int ndim() const { return static_cast<int>(shape.size()); }
  size_t bytes() const { return data.size() * sizeof(float); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }
  float& operator[](int64_t i) { return data[static_cast<size_t>(i)]; }
  float operator[](int64_t i) const { return data[static_cast<size_t>(i)]; }
  void zero() { std::fill(data.begin(), data.end(), 0.0f); }
  bool empty() const { return data.empty(); }
  std::string shape_str() const;
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
