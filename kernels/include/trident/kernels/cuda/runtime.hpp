// The CUDA runtime pieces the rest of trident holds without seeing a CUDA
// header: device discovery, a stream-ordered caching allocator, streams and
// events whose waits have a deadline, and StreamContext, which owns one
// device's stream, cuBLAS handle, allocator and workspace and hands out the
// kernels::Ctx that every op takes. Handles are void* (cudaStream_t,
// cudaEvent_t, cublasHandle_t) as in kernels/context.hpp.
#pragma once
#include <memory>
#include <string>

#include "trident/core/allocator.hpp"
#include "trident/kernels/context.hpp"

namespace trident::kernels::cuda {

// Visible CUDA devices; 0 (never an exception) when there is no driver or no
// device, and then no_device_reason() says why.
int device_count();
std::string no_device_reason();
// This thread's current device: cudaSetDevice / cudaGetDevice (0 when the
// runtime cannot say).
void set_current_device(int device);
int current_device();

// Device memory from the device's default memory pool, allocated and freed in
// the order of `stream` (cudaMallocAsync/cudaFreeAsync). The pool keeps freed
// memory for reuse (release threshold: unlimited), so steady-state training
// allocates nothing from the driver.
class CudaAllocator final : public Allocator {
 public:
  CudaAllocator(int device, void* stream);
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) noexcept override;
  Device device() const override { return Device::cuda(device_); }

 private:
  int device_;
  void* stream_;
};

// A non-blocking stream of one device (it does not synchronise with the
// legacy default stream).
class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* get() const { return s_; }
  // Returns when all work enqueued so far has finished; TimeoutError after
  // timeout_s naming `what`.
  void synchronize(double timeout_s, const std::string& what) const;

 private:
  void* s_ = nullptr;
};

// A CUDA event with timing. record() marks a point in a stream; other streams
// wait for it on the device (wait_on), the host polls it (wait, ready).
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void* get() const { return e_; }
  void record(void* stream);
  bool ready() const;
  void wait(double timeout_s, const std::string& what) const;
  // Makes `stream` wait on the device for this event (no host block).
  void wait_on(void* stream) const;
  // Milliseconds from `start` to this event (both recorded and complete).
  float elapsed_ms(const Event& start) const;

 private:
  void* e_ = nullptr;
};

// Everything one stream of work on a device needs to run ops: owns the
// stream, the cuBLAS handle bound to it (fp32 GEMMs without TF32), the
// allocator ordered on it and a workspace, and hands out the Ctx.
class StreamContext {
 public:
  explicit StreamContext(int device);
  ~StreamContext();
  StreamContext(const StreamContext&) = delete;
  StreamContext& operator=(const StreamContext&) = delete;

  Ctx ctx() {
    return Ctx{Device::cuda(device_), stream_->get(), blas_, workspace_.get(), alloc_.get()};
  }
  Stream& stream() { return *stream_; }
  CudaAllocator& allocator() { return *alloc_; }
  int device() const { return device_; }

 private:
  int device_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<CudaAllocator> alloc_;
  std::unique_ptr<Workspace> workspace_;
  void* blas_ = nullptr;
};

// Host <-> device copies ordered on the Ctx's stream (bytes; a null-size copy
// does nothing). Device-to-host copies return when the data is on the host,
// waiting at most timeout_s.
void copy_to_device(const Ctx& c, void* dst, const void* src, size_t bytes);
void copy_to_host(const Ctx& c, void* dst, const void* src, size_t bytes, double timeout_s = 300.0);
void copy_device(const Ctx& c, void* dst, const void* src, size_t bytes);
void fill_zero(const Ctx& c, void* dst, size_t bytes);
void synchronize(const Ctx& c, double timeout_s, const std::string& what);

}  // namespace trident::kernels::cuda
