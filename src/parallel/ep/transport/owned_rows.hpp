// ForwardRows in buffers of their own (local and alltoallv transports),
// recycled through a pool shared with the transport: a fresh buffer per
// layer would page-fault and zero its memory every time.
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "trident/parallel/ep/token_dispatcher.hpp"

namespace trident::ep {

class BufferPool {
 public:
  void recycle(std::vector<float>&& v) {
    if (v.capacity() > 0 && spare_.size() < 16) spare_.push_back(std::move(v));
  }
  std::vector<float> take(size_t n) {
    std::vector<float> v;
    if (!spare_.empty()) {
      v = std::move(spare_.back());
      spare_.pop_back();
    }
    if (v.size() < n) v.resize(n);  // grow only: kept elements are not re-zeroed
    return v;
  }

 private:
  std::vector<std::vector<float>> spare_;
};

class OwnedRows : public ForwardRows {
 public:
  OwnedRows(std::shared_ptr<BufferPool> pool, size_t in_out_floats, size_t kept_floats)
      : pool_(std::move(pool)) {
    own_in_ = pool_->take(in_out_floats);
    own_out_ = pool_->take(in_out_floats);
    if (kept_floats > 0) kept.rows = pool_->take(kept_floats);
    in_ = own_in_.data();
    out_ = own_out_.data();
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
  std::vector<float> own_in_, own_out_;
};

}  // namespace trident::ep
