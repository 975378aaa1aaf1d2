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
  // in() and out(): rows [R, d] each; kept: room for S rows of d (0: none).
  OwnedRows(std::shared_ptr<BufferPool> pool, int64_t R, int64_t S, int64_t d)
      : pool_(std::move(pool)) {
    own_in_ = pool_->take(size_t(R * d));
    own_out_ = pool_->take(size_t(R * d));
    if (S > 0) kept.rows = pool_->take(size_t(S * d));
    in_ = own_in_.view(0, {R, d});
    out_ = own_out_.view(0, {R, d});
  }
  ~OwnedRows() override {
    pool_->recycle(std::move(own_in_));
    pool_->recycle(std::move(own_out_));
    pool_->recycle(std::move(kept.rows));
  }
  void set_returned(kernels::RowBlocks s) {
    returned_ = std::move(s);
    back_ = true;
  }
  KeptRows kept;  // alltoallv: the rows back on the source

 private:
  std::shared_ptr<BufferPool> pool_;
  Tensor own_in_, own_out_;
};

}  // namespace trident::ep
