// Tensors made for a Ctx, and the whole-tensor copies and fills that must run
// on the tensor's device.
//
// Layers above the kernels allocate activations, caches and communication
// buffers here rather than with Tensor's host constructor, so that the same
// code puts them on the host or on a GPU (from ctx's allocator, ordered on
// its stream) and every byte is counted by that device's allocator.
#pragma once
#include <cstdint>
#include <vector>

#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"

namespace trident::kernels {

// Uninitialised elements on ctx's device.
Tensor empty(const Ctx& ctx, std::vector<int64_t> shape, DType dtype = DType::f32);
// f32 zeros on ctx's device.
Tensor zeros(const Ctx& ctx, std::vector<int64_t> shape);
// A buffer reused call after call: afterwards t holds at least n f32 on
// ctx's device. It grows only; a growth drops the old elements and does not
// initialise the new ones.
void reserve(const Ctx& ctx, Tensor& t, int64_t n);
// dst <- src (same dtype and numel, both on ctx's device; may be views).
void copy(const Ctx& ctx, Tensor& dst, const Tensor& src);
// A new tensor on ctx's device with src's shape and elements (src on the
// host or on ctx's device).
Tensor clone(const Ctx& ctx, const Tensor& src);
// The elements of src (any device) in a new host tensor; waits for the copy.
Tensor to_host(const Ctx& ctx, const Tensor& src);
// A new tensor on ctx's device holding the host elements at `host`
// (numel(shape) elements of `dtype`): the one explicit upload of index data.
Tensor from_host(const Ctx& ctx, const void* host, std::vector<int64_t> shape, DType dtype);

// Returns when every op enqueued on ctx's stream so far has finished: what
// a wall-clock timer reads after the work it times (a GPU runs ops after
// the call that enqueued them). CUDA: the stream's work waited for, polled
// for at most timeout_s (TimeoutError past it), and an error it raised
// thrown; the host and the emulated device run an op to its end within
// the call, so there is nothing to wait for.
void synchronize(const Ctx& ctx, double timeout_s = 300.0);

}  // namespace trident::kernels
