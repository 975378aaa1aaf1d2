// Tensor storage, views and host helpers, and the difference measures used
// by parity tests.
#include "trident/core/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "trident/core/error.hpp"

namespace trident {

Storage::Storage(Allocator& alloc, size_t bytes)
    : alloc_(&alloc), bytes_(bytes), ptr_(alloc.allocate(bytes)) {}

Storage::Storage(void* borrowed, size_t bytes, Device device)
    : alloc_(nullptr), bytes_(bytes), ptr_(borrowed), device_(device) {}

Storage::~Storage() {
  if (alloc_) alloc_->deallocate(ptr_, bytes_);
}

int64_t Tensor::numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) {
    TRIDENT_CHECK(d >= 0, "Tensor: negative dimension in shape");
    n *= d;
  }
  return n;
}

Tensor Tensor::empty(std::vector<int64_t> shape, Allocator& alloc, DType dtype) {
  Tensor t;
  t.numel_ = numel_of(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  if (t.numel_ > 0) t.storage_ = std::make_shared<Storage>(alloc, t.bytes());
  return t;
}

Tensor Tensor::borrow(void* data, std::vector<int64_t> shape, Device device, DType dtype) {
  Tensor t;
  t.numel_ = numel_of(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  TRIDENT_CHECK(data != nullptr || t.numel_ == 0, "Tensor::borrow: null data for " + t.shape_str());
  if (t.numel_ > 0) t.storage_ = std::make_shared<Storage>(data, t.bytes(), device);
  return t;
}

Tensor::Tensor(std::vector<int64_t> shape, float fill_value) {
  *this = empty(std::move(shape));
  fill(fill_value);
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

Tensor Tensor::view(int64_t offset, std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.numel_ = numel_of(shape);
  TRIDENT_CHECK(offset >= 0 && offset + t.numel_ <= numel_,
                "Tensor::view: " + std::to_string(t.numel_) + " elements at offset " +
                    std::to_string(offset) + " do not fit in " + shape_str());
  t.offset_ = offset_ + offset;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  TRIDENT_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
                "Tensor::rows: [" + std::to_string(begin) + ", " + std::to_string(end) +
                    ") outside " + shape_str());
  std::vector<int64_t> s = shape_;
  s[0] = end - begin;
  const int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  return view(begin * row, std::move(s));
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  TRIDENT_CHECK(numel_of(shape) == numel_,
                "Tensor::reshape: element count differs from " + shape_str());
  return view(0, std::move(shape));
}

void Tensor::check_dtype(DType want) const {
  TRIDENT_CHECK(want == dtype_, std::string("Tensor: element access as ") + dtype_name(want) +
                                    " of a " + dtype_name(dtype_) + " tensor");
}

float* Tensor::host_f32() const {
  TRIDENT_CHECK(device().is_cpu(),
                "Tensor: host element access to a " + device().str() + " tensor");
  return data<float>();
}

void Tensor::fill(float value) {
  float* p = host_f32();
  std::fill(p, p + numel_, value);
}

Tensor Tensor::clone() const {
  TRIDENT_CHECK(device().is_cpu(),
                "Tensor::clone: " + device().str() + " tensors are cloned by kernels::clone");
  Tensor t = empty(shape_, cpu_allocator(), dtype_);
  if (numel_ > 0) std::memcpy(t.base<char>(), base<char>(), bytes());
  return t;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape_.size(); ++i) s += (i ? ", " : "") + std::to_string(shape_[i]);
  return s + "]";
}

double max_rel_diff(const float* a, const float* b, int64_t n, double floor) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = std::fabs(double(a[i]) - double(b[i]));
    double s = std::max(std::fabs(double(b[i])), floor);
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, d / s);
  }
  return worst;
}

double rel_l2_diff(const float* a, const float* b, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  if (std::isnan(num)) return INFINITY;
  if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

}  // namespace trident
