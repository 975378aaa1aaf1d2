// ParamStore: the parameters of one pipeline stage in one allocation.
//
// The model builds each Param with its own tensors (core/param.hpp); once a
// stage's chunks are built and initialised, a ParamStore takes their Param
// list, lays the parameters out one after another, grouped by how their
// gradients are reduced (dense, then expert, then none; within a group in
// the stage's parameter order), and allocates one value buffer and one
// gradient buffer from the stage's allocator. Each Param's value and grad
// become views into them, so nothing that holds a Param* notices; the old
// per-parameter tensors are released.
//
// Why: gradient reduction works on the contiguous range of a kind in place
// (no packing, the same elements in the same order as the packed buffer
// had, so the same sums), zeroing the gradients is one fill, and a sharded
// optimizer or a device copy addresses one buffer instead of a list (llm.c
// keeps its parameters the same way).
//
// Layering: core cannot call the kernels, so the copy of the initial values
// into the new buffer is handed in (the caller passes the copy op of the
// stage's kernels::Ctx; the value buffer may live on a device).
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "trident/core/allocator.hpp"
#include "trident/core/param.hpp"
#include "trident/core/tensor.hpp"

namespace trident {

class ParamStore {
 public:
  // dst <- src, same numel and dtype; src may live on another device.
  using CopyFn = std::function<void(Tensor& dst, const Tensor& src)>;

  // One parameter's place: elements [offset, offset + numel) of both buffers.
  struct Entry {
    Param* param = nullptr;
    int64_t offset = 0, numel = 0;
  };
  // Elements [begin, end) of the buffers.
  struct Range {
    int64_t begin = 0, end = 0;
    int64_t size() const { return end - begin; }
  };

  // x[i] = value for every element of dst.
  using FillFn = std::function<void(Tensor& dst, float value)>;

  // Takes over `params` (each exactly once; every value f32). Values are
  // copied into the new buffer with `copy`; gradients start at zero.
  // range_multiple[kind]: each kind's range is padded with zeros (belonging
  // to no parameter) to a multiple of it, so that it splits into equal
  // shards (parallel/dp/zero.hpp); 1: no padding, a kind's range holds
  // exactly its parameters.
  ParamStore(const std::vector<Param*>& params, Allocator& alloc, const CopyFn& copy,
             const FillFn& fill, std::array<int64_t, 3> range_multiple = {1, 1, 1});
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Parameters in store order (dense, expert, none).
  const std::vector<Entry>& entries() const { return entries_; }
  std::vector<Param*> params() const;
  // The entry of p (throws when p is not in the store).
  const Entry& entry(const Param* p) const;
  int64_t numel() const { return numel_; }

  // The contiguous range of one reduction kind.
  Range range(GradReduce kind) const { return ranges_[size_t(kind)]; }

  // The whole buffers, [numel()].
  const Tensor& values() const { return values_; }
  const Tensor& grads() const { return grads_; }
  // Views of one kind's range (shared storage; empty when the kind has none).
  Tensor values(GradReduce kind) const;
  Tensor grads(GradReduce kind) const;

 private:
  std::vector<Entry> entries_;
  std::map<const Param*, size_t> index_;
  std::array<Range, 3> ranges_{};
  int64_t numel_ = 0;
  Tensor values_, grads_;
};

}  // namespace trident
