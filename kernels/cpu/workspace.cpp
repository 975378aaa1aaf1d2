// Workspace: scratch memory of one device, grown to the largest request.
#include "trident/kernels/context.hpp"

namespace trident::kernels {

Workspace::~Workspace() { alloc_->deallocate(ptr_, bytes_); }

void* Workspace::get(size_t bytes) {
  if (bytes <= bytes_) return ptr_;
  alloc_->deallocate(ptr_, bytes_);
  ptr_ = nullptr;
  bytes_ = 0;
  ptr_ = alloc_->allocate(bytes);
  bytes_ = bytes;
  return ptr_;
}

}  // namespace trident::kernels
