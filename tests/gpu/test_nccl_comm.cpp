// NcclCommunicator on one GPU, one rank: self send/receive in a group,
// all-reduce of each element type and reduction, broadcast, all-gather and
// all-to-all-v against what the host (MPI) computes for one rank (the
// all-to-all-v definition on host copies), and a receive nobody sends
// ending in a TimeoutError that names rank, operation and peer. Exits 77
// (ctest SKIP) with the reason when no CUDA device is visible.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/comm/nccl/nccl_communicator.hpp"
#include "trident/core/error.hpp"

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

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  cudaMalloc(&d, h.size() * sizeof(T));
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

template <typename T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
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
  c.wait(s);
  c.wait(r);
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

void timeout_names_the_peer() {
  auto host = std::make_unique<SelfHost>();
  NcclCommunicator c(std::move(host));
  float* buf = to_device(std::vector<float>(4, 0.0f));
  std::string msg;
  try {
    Request r = c.irecv(buf, 16, 0, 9);  // nobody sends: the deadline (5 s) ends it
    c.wait(r);
  } catch (const TimeoutError& e) {
    msg = e.what();
  }
  expect(msg.find("rank 0: recv of 16 B from rank 0") == 0 &&
             msg.find("timed out") != std::string::npos,
         "timeout message names rank, operation and peer: '" + msg + "'");
  cudaFree(buf);
}

}  // namespace

int main() {
  if (nccl_visible_devices() == 0) {
    std::printf("SKIP: no CUDA device visible (NcclCommunicator needs one)\n");
    return 77;
  }
  cudaSetDevice(0);
  try {
    NcclCommunicator c(std::make_unique<SelfHost>());
    expect(c.device() == Device::cuda(0), "device is the current CUDA device");
    self_send_recv(c);
    reductions(c);
    alltoallv_and_gather(c);
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
