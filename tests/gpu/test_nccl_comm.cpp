// NcclCommunicator on one GPU, one rank: self send/receive in a group,
// all-reduce of each element type and reduction, broadcast, all-gather and
// all-to-all-v against what the host (MPI) computes for one rank (the
// all-to-all-v definition on host copies), and a receive that cannot start
// ending in a TimeoutError that names rank, operation and peer, after which
// the aborted communicator's other requests fail with a message (not a
// crash). Exits 77 (ctest SKIP) with the reason when no CUDA device is
// visible.
//
// Uploads and downloads synchronise the device: cudaMemcpy from pageable
// memory runs on the legacy default stream, which the communicator's
// non-blocking stream does not wait for.
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/comm/nccl/nccl_communicator.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/buffer_uses.hpp"

using namespace trident;

namespace {

int g_failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

// Completed at once.
class Done final : public PendingOp {
 public:
  bool poll() override { return true; }
};

// The host group of a one-rank job without MPI: every collective of one rank
// leaves the data as it is (the NCCL id broadcast, barriers).
class SelfHost final : public Communicator {
 public:
  SelfHost() : Communicator(CommKind::cp, "self", 5.0, 0, {0}) {}
  const char* backend_name() const override { return "self"; }
  Device device() const override { return Device::cpu(); }
  int max_tag() const override { return 32767; }
  Communicator& host() override { return *this; }
  std::unique_ptr<Communicator> split(int color, int, CommKind, std::string) override {
    return color < 0 ? nullptr : std::make_unique<SelfHost>();
  }
  std::unique_ptr<Communicator> split_node(CommKind, std::string) override {
    return std::make_unique<SelfHost>();
  }

 protected:
  std::unique_ptr<PendingOp> unused(const char* what) {
    throw Error(std::string("SelfHost: ") + what + " is not used by this test");
  }
  std::unique_ptr<PendingOp> post(const CommOp& op) override {
    switch (op.kind) {
      case CommOp::Kind::send:
        return unused("send");
      case CommOp::Kind::recv:
        return unused("recv");
      case CommOp::Kind::alltoallv:
        return unused("alltoallv");
      case CommOp::Kind::allgather:
        if (op.in != op.out) std::memcpy(op.out, op.in, op.bytes);
        return std::make_unique<Done>();
      default:  // allreduce, broadcast, barrier of one rank
        return std::make_unique<Done>();
    }
  }
  size_t max_elements_per_reduction() const override { return size_t(1) << 30; }
};

void cuda_ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(rc));
}

// Complete on the device before it returns, so that an operation on any
// stream posted afterwards reads the uploaded bytes.
template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  cuda_ok(cudaMalloc(&d, h.size() * sizeof(T)), "cudaMalloc");
  cuda_ok(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  cuda_ok(cudaDeviceSynchronize(), "upload: cudaDeviceSynchronize");
  return d;
}

// Called after the operation that wrote d was waited for; the device sync
// also covers work another stream might still hold.
template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  cuda_ok(cudaDeviceSynchronize(), "download: cudaDeviceSynchronize");
  cuda_ok(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return h;
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::vector<float> v(n);
  unsigned x = seed * 2654435761u + 1;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = float(x >> 8) / float(1 << 24) * 2.0f - 1.0f + 1e-3f;
  }
  return v;
}

void self_send_recv(NcclCommunicator& c) {
  const auto in = random_floats(1000, 1);
  float* src = to_device(in);
  float* dst = to_device(std::vector<float>(in.size(), 0.0f));
  c.begin_group();
  Request s = c.isend(src, in.size() * sizeof(float), 0, 1);
  Request r = c.irecv(dst, in.size() * sizeof(float), 0, 1);
  c.end_group();
  // Both buffers are recorded in use until the group's event
  // (kernels/buffer_uses.hpp): a host free of dst waits for the receive, so
  // dst holds the message before the request is waited for.
  const size_t bytes = in.size() * sizeof(float);
  trident::kernels::buffer_uses().before_free(dst, bytes, nullptr, 30.0);
  expect(to_host(dst, in.size()) == in, "the receive is done when a free of its buffer may go");
  c.wait(s);
  c.wait(r);
  expect(trident::kernels::buffer_uses().recorded() == 0, "no use pending once the group is done");
  expect(to_host(dst, in.size()) == in, "self send/recv delivers the bytes unchanged");
  cudaFree(src);
  cudaFree(dst);
}

void reductions(NcclCommunicator& c) {
  // One rank: every reduction leaves the data as it is, as MPI's does.
  const auto f = random_floats(4097, 2);
  float* df = to_device(f);
  c.allreduce_sum(df, f.size());
  expect(to_host(df, f.size()) == f, "allreduce_sum float on one rank");
  std::vector<double> d(333);
  for (size_t i = 0; i < d.size(); ++i) d[i] = double(f[i]) * 3.0;
  double* dd = to_device(d);
  c.allreduce_max(dd, d.size());
  c.allreduce_min(dd, d.size());
  expect(to_host(dd, d.size()) == d, "allreduce max/min double on one rank");
  std::vector<int64_t> k(17);
  for (size_t i = 0; i < k.size(); ++i) k[i] = int64_t(i) * 1000003 - 7;
  int64_t* dk = to_device(k);
  c.allreduce_sum(dk, k.size());
  expect(to_host(dk, k.size()) == k, "allreduce_sum int64 on one rank");
  // A host scalar goes to the host group and still works.
  double loss = 1.25;
  c.allreduce_sum(&loss, 1);
  expect(loss == 1.25, "allreduce_sum of a host scalar through the host group");
  cudaFree(df);
  cudaFree(dd);
  cudaFree(dk);
}

void alltoallv_and_gather(NcclCommunicator& c) {
  // Elements of 12 B (rows of 3 floats): the kept block is copied to the
  // receive displacement, as MPI_Alltoallv does on one rank.
  const std::vector<int64_t> sc{5}, sd{2}, rc{5}, rd{4};
  const auto in = random_floats(3 * 9, 3);
  float* src = to_device(in);
  float* dst = to_device(std::vector<float>(3 * 10, 0.0f));
  c.alltoallv(src, sc, sd, dst, rc, rd, 3 * sizeof(float));
  std::vector<float> want(3 * 10, 0.0f);
  std::memcpy(&want[3 * 4], &in[3 * 2], 5 * 3 * sizeof(float));
  expect(to_host(dst, want.size()) == want, "alltoallv on one rank");
  float* g = to_device(std::vector<float>(in.size(), 0.0f));
  c.allgather(src, g, in.size() * sizeof(float));
  expect(to_host(g, in.size()) == in, "allgather on one rank");
  c.broadcast(g, in.size() * sizeof(float), 0);
  expect(to_host(g, in.size()) == in, "broadcast on one rank");
  c.barrier();
  cudaFree(src);
  cudaFree(dst);
  cudaFree(g);
}

// A compute stream held by a host function until `release` is set (or,
// as a bound on the test, until 4x the communicator's deadline): operations
// posted after it wait behind it, because the communicator orders its
// stream after the compute stream (set_compute_stream).
struct StreamBlocker {
  std::atomic<bool> release{false};
  double limit_s = 20.0;
  static void hold(void* self) {
    auto* b = static_cast<StreamBlocker*>(self);
    const auto t0 = std::chrono::steady_clock::now();
    while (!b->release.load() &&
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
               b->limit_s)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

// A self send/receive that cannot start: the compute stream it follows is
// blocked. The wait must end at the deadline with the rank, the operation
// and the peer, abort the communicator, and leave the other request of the
// group failing with a message instead of touching the freed communicator.
void timeout_names_the_peer() {
  auto host = std::make_unique<SelfHost>();
  NcclCommunicator c(std::move(host));
  cudaStream_t compute = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate");
  float* src = to_device(std::vector<float>(4, 1.0f));
  float* dst = to_device(std::vector<float>(4, 0.0f));
  StreamBlocker blocker;
  blocker.limit_s = 4.0 * c.timeout_s();
  cuda_ok(cudaLaunchHostFunc(compute, &StreamBlocker::hold, &blocker), "cudaLaunchHostFunc");
  c.set_compute_stream(compute);
  std::string msg, after_abort;
  const auto t0 = std::chrono::steady_clock::now();
  // Released a second after the deadline: the group cannot start before the
  // wait times out, and an abort that waits for the device (NCCL may
  // synchronise when it frees memory) then finishes.
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::duration<double>(c.timeout_s() + 1.0));
    blocker.release = true;
  });
  // Also on an unexpected exception: the thread is joined, the host function
  // done before `blocker` goes out of scope, and the stream destroyed.
  struct Joiner {
    std::thread& t;
    cudaStream_t s;
    ~Joiner() {
      if (t.joinable()) t.join();
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  } joiner{releaser, compute};
  {
    c.begin_group();
    Request s = c.isend(src, 16, 0, 9);
    Request r = c.irecv(dst, 16, 0, 9);
    c.end_group();
    try {
      c.wait(r);
    } catch (const TimeoutError& e) {
      msg = e.what();
    }
    try {
      c.wait(s);
    } catch (const TimeoutError& e) {
      after_abort = std::string("TimeoutError: ") + e.what();
    } catch (const Error& e) {
      after_abort = e.what();
    }
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  releaser.join();
  cuda_ok(cudaStreamSynchronize(compute), "cudaStreamSynchronize(compute)");
  expect(msg.find("rank 0: recv of 16 B from rank 0") == 0 &&
             msg.find("timed out") != std::string::npos,
         "timeout message names rank, operation and peer: '" + msg + "'");
  expect(waited >= c.timeout_s() && waited < 3.0 * c.timeout_s(),
         "the wait ended at its deadline, the abort included (" + std::to_string(waited) +
             " s, deadline " + std::to_string(c.timeout_s()) + " s)");
  expect(after_abort.find("was aborted") != std::string::npos,
         "after the abort the group's send fails with a message: '" + after_abort + "'");
  bool refused = false;
  try {
    Request again = c.irecv(dst, 16, 0, 9);
  } catch (const Error& e) {
    refused = std::string(e.what()).find("was aborted") != std::string::npos;
  }
  expect(refused, "a new operation on the aborted communicator is refused");
  cudaFree(src);
  cudaFree(dst);
}

}  // namespace

int main() {
  // The runtime's own count: the standalone build links no kernels layer.
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device visible (NcclCommunicator needs one)\n");
    return 77;
  }
  cudaSetDevice(0);
  try {
    NcclCommunicator c(std::make_unique<SelfHost>());
    expect(c.device() == Device::cuda(0), "device is the current CUDA device");
    // Device operations need the compute stream they follow (comm.hpp).
    float* one = to_device(std::vector<float>(1, 1.0f));
    bool refused = false;
    try {
      c.allreduce_sum(one, 1);
    } catch (const Error& e) {
      refused = std::string(e.what()).find("no compute stream") != std::string::npos;
    }
    expect(refused, "a device operation without a compute stream is refused");
    cudaFree(one);
    cudaStream_t compute = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), "cudaStreamCreate");
    c.set_compute_stream(compute);
    self_send_recv(c);
    reductions(c);
    alltoallv_and_gather(c);
    cudaStreamDestroy(compute);
  } catch (const std::exception& e) {
    expect(false, std::string("exception: ") + e.what());
  }
  try {
    timeout_names_the_peer();
  } catch (const std::exception& e) {
    expect(false, std::string("exception in the timeout case: ") + e.what());
  }
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "passed", g_failures);
  return g_failures ? 1 : 0;
}
