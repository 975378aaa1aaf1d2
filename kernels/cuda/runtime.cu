// Device discovery, the stream-ordered allocator, streams, events and the
// StreamContext of kernels/include/trident/kernels/cuda/runtime.hpp.
#include <cstdint>

#include "trident/kernels/buffer_uses.hpp"
#include "trident/kernels/cuda/check.hpp"
#include "trident/kernels/cuda/deadline.hpp"
#include "trident/kernels/cuda/runtime.hpp"

namespace trident::kernels::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

// The device whose memory, stream or handle is made next: CUDA's current
// device is per thread, so every entry point that creates something sets it.
void use_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later queries start clean
    return 0;
  }
  return n;
}

void set_current_device(int device) { use_device(device); }

int current_device() {
  int d = 0;
  if (cudaGetDevice(&d) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return d;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  return n == 0 ? "no CUDA device visible" : "";
}

CudaAllocator::CudaAllocator(int device, void* stream) : device_(device), stream_(stream) {
  use_device(device);
  cudaMemPool_t pool;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

void* CudaAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  const cudaError_t e = cudaMallocAsync(&p, bytes, as_stream(stream_));
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error("cuda:" + std::to_string(device_) + ": cannot allocate " + std::to_string(bytes) +
                " bytes (" + cudaGetErrorString(e) + "); " + std::to_string(bytes_in_use()) +
                " bytes in use");
  }
  count_alloc(p, bytes);
  return p;
}

void CudaAllocator::deallocate(void* p, size_t bytes) noexcept {
  if (!p) return;
  // A failure here means the context is already broken; the next checked
  // call reports it, and a destructor must not throw.
  count_free(p, bytes);  // before the address can be handed out again
  try {
    // A pending communication on p (NCCL's stream) ends before the free on
    // this stream, or the pool could hand p to the next allocation while
    // NCCL still reads or writes it.
    buffer_uses().before_free(p, bytes, stream_);
  } catch (const std::exception&) {
  }
  (void)cudaFreeAsync(p, as_stream(stream_));
}

Stream::Stream(int device) {
  use_device(device);
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  s_ = s;
}

Stream::~Stream() {
  if (s_) (void)cudaStreamDestroy(as_stream(s_));
}

void Stream::synchronize(double timeout_s, const std::string& what) const {
  wait_until(
      [&] {
        const cudaError_t e = cudaStreamQuery(as_stream(s_));
        if (e == cudaErrorNotReady) return false;
        CUDA_CHECK(e);
        return true;
      },
      timeout_s, what);
}

Event::Event() {
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreate(&e));
  e_ = e;
}

Event::~Event() {
  if (e_) (void)cudaEventDestroy(as_event(e_));
}

void Event::record(void* stream) { CUDA_CHECK(cudaEventRecord(as_event(e_), as_stream(stream))); }

bool Event::ready() const {
  const cudaError_t e = cudaEventQuery(as_event(e_));
  if (e == cudaErrorNotReady) return false;
  CUDA_CHECK(e);
  return true;
}

void Event::wait(double timeout_s, const std::string& what) const {
  wait_until([&] { return ready(); }, timeout_s, what);
}

void Event::wait_on(void* stream) const {
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(e_), 0));
}

float Event::elapsed_ms(const Event& start) const {
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, as_event(start.e_), as_event(e_)));
  return ms;
}

StreamContext::StreamContext(int device) : device_(device) {
  stream_ = std::make_unique<Stream>(device);
  alloc_ = std::make_unique<CudaAllocator>(device, stream_->get());
  workspace_ = std::make_unique<Workspace>(*alloc_);
  cublasHandle_t h;
  CUBLAS_CHECK(cublas().create(&h));
  blas_ = h;
  CUBLAS_CHECK(cublas().set_stream(h, as_stream(stream_->get())));
  // The math mode is set by every GEMM for itself (gemm_math, gemm.cu):
  // fp32 pedantic unless the Ctx allows TF32, bf16 on the tensor cores.
}

StreamContext::~StreamContext() {
  (void)cudaSetDevice(device_);
  workspace_.reset();  // frees on the stream, which must still exist
  try {
    stream_->synchronize(60.0, "work left on cuda:" + std::to_string(device_) + " at shutdown");
  } catch (const std::exception&) {
    // A destructor cannot report; the stream and handle are released anyway.
  }
  if (blas_) (void)cublas().destroy(static_cast<cublasHandle_t>(blas_));
}

void copy_to_device(const Ctx& c, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(c.stream)));
}

void copy_device(const Ctx& c, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(c.stream)));
}

void fill_zero(const Ctx& c, void* dst, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, as_stream(c.stream)));
}

void synchronize(const Ctx& c, double timeout_s, const std::string& what) {
  Event done;
  done.record(c.stream);
  done.wait(timeout_s, what);
}

void copy_to_host(const Ctx& c, void* dst, const void* src, size_t bytes, double timeout_s) {
  if (bytes == 0) return;
  // A copy into pageable memory returns only when it is done, without a
  // deadline; waiting for the work before it first (polled) leaves the copy
  // itself as the only blocking part, and it cannot hang on a kernel.
  synchronize(c, timeout_s,
              "work before a copy of " + std::to_string(bytes) + " bytes to the host");
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(c.stream)));
  synchronize(c, timeout_s, "copy of " + std::to_string(bytes) + " bytes to the host");
}

}  // namespace trident::kernels::cuda
