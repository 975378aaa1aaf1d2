// Scratch memory of one CPU kernel call: carved from ctx.workspace, or owned
// by the Scratch itself when the Ctx has none (one-off calls, tests), so
// that a stage that runs many calls allocates once.
#pragma once
#include <cstddef>
#include <vector>

#include "trident/kernels/context.hpp"

namespace trident::kernels::cpu {

class Scratch {
 public:
  // Room for `floats` floats in all, handed out by take().
  Scratch(const Ctx& ctx, size_t floats) : size_(floats) {
    if (ctx.workspace) {
      base_ = static_cast<float*>(ctx.workspace->get(floats * sizeof(float)));
    } else {
      own_.resize(floats);
      base_ = own_.data();
    }
  }
  // The next n floats (uninitialised when they come from a workspace).
  float* take(size_t n) {
    float* p = base_ + used_;
    used_ += n;
    return used_ <= size_ ? p : nullptr;
  }

 private:
  std::vector<float> own_;
  float* base_ = nullptr;
  size_t size_ = 0, used_ = 0;
};

}  // namespace trident::kernels::cpu
