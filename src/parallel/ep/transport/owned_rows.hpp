// ForwardRows in buffers of their own (local and alltoallv transports),
// recycled through a pool shared with the transport: a fresh buffer per
// layer would page-fault and zero its memory every time.
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "trident/kernels/tensor_ops.hpp"
#include "trident/parallel/ep/token_dispatcher.hpp"

namespace trident::ep {

class BufferPool {
 public:
  explicit BufferPool(const kernels::Ctx& ctx) : ctx_(ctx) {}
  void recycle(Tensor&& t) {
    if (!t.empty() && spare_.size() < 16) spare_.push_back(std::move(t));
  }
  // At least n floats from ctx's allocator (not initialised).
  Tensor take(size_t n) {
    Tensor t;
    if (!spare_.empty()) {
      t = std::move(spare_.back());
      spare_.pop_back();
    }
    kernels::reserve(ctx_, t, int64_t(n));
    return t;
  }

 private:
  kernels::Ctx ctx_;
  std::vector<Tensor> spare_;
};

class OwnedRows : public ForwardRows {
 public:
  OwnedRows(std::shared_ptr<BufferPool> pool, size_t in_out_floats, size_t kept_floats)
      : pool_(std::move(pool)) {
    own_in_ = pool_->take(in_out_floats);
    own_out_ = pool_->take(in_out_floats);
    if (kept_floats > 0) kept.rows = pool_->take(kept_floats);
    in_ = own_in_.empty() ? nullptr : own_in_.ptr();
    out_ = own_out_.empty() ? nullptr : own_out_.ptr();
  }
  ~OwnedRows() override {
    pool_->recycle(std::move(own_in_));
    pool_->recycle(std::move(own_out_));
    pool_->recycle(std::move(kept.rows));
  }
  void set_returned(const kernels::RowSource& s) {
    returned_ = s;
    back_ = true;
  }
  KeptRows kept;  // alltoallv: the rows back on the source

 private:
  std::shared_ptr<BufferPool> pool_;
  Tensor own_in_, own_out_;
};

}  // namespace trident::ep
