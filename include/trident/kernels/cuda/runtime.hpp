// The CUDA runtime pieces the rest of trident holds without seeing a CUDA
// header: device discovery, a stream-ordered caching allocator, streams and
// events whose waits have a deadline, and DeviceContext, which owns one
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
// device, with the reason in *why when given.
int device_count(std::string* why = nullptr);

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

// Everything one device needs to run ops: owns the compute stream, the cuBLAS
// handle bound to it (fp32 GEMMs without TF32), the allocator and the
// workspace. One per device and thread of work.
class DeviceContext {
 public:
  explicit DeviceContext(int device);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  Ctx ctx() { return Ctx{Device::cuda(device_), stream_->get(), blas_, workspace_.get()}; }
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
