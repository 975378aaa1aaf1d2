// Ops on the emulated device: the CPU kernels with its guard lifted, so the
// same inputs give bit-identical outputs on a host Ctx and an emulated one;
// copies between the host and the device are explicit and exact; and the
// device's memory stays closed to host code around the ops.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_ctx.hpp"
#include "random.hpp"
#include "trident/core/emulated.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/gemm.hpp"
#include "trident/kernels/moe.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/kernels/router.hpp"
#include "trident/kernels/tensor_ops.hpp"

using namespace trident;
using trident::testing::random_tensor;

namespace {

const kernels::Ctx& emulated_ctx() {
  static kernels::DeviceContext device(Device::emulated());
  return device.ctx();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.bytes()) == 0;
}

}  // namespace

TEST_CASE("an emulated DeviceContext makes tensors in the arena", "[emulated]") {
  const kernels::Ctx& dev = emulated_ctx();
  CHECK(dev.device == Device::emulated());
  CHECK(kernels::allocator_of(dev).device() == Device::emulated());
  CHECK(kernels::select_device(Backend::emulated, 5) == Device::emulated());
  Tensor z = kernels::zeros(dev, {3, 5});
  CHECK(z.device() == Device::emulated());
  CHECK(emulated::contains(z.data_ptr()));
  CHECK(emulated::contains(dev.workspace->get(64)));  // the ops' scratch is device memory
}

TEST_CASE("host <-> emulated copies are exact and explicit", "[emulated]") {
  const kernels::Ctx& dev = emulated_ctx();
  const Tensor x = random_tensor({7, 9}, "emul.copy");
  Tensor d = kernels::clone(dev, x);
  CHECK(d.device() == Device::emulated());
  Tensor d2 = kernels::empty(dev, {7, 9});
  kernels::copy(dev, d2, d);  // emulated -> emulated
  const Tensor back = kernels::to_host(dev, d2);
  CHECK(back.device() == Device::cpu());
  CHECK(same_bits(back, x));
  Tensor f = kernels::empty(dev, {100});
  kernels::fill(dev, f.ptr(), f.numel(), 1.5f);
  const Tensor fh = kernels::to_host(dev, f);
  for (int64_t i = 0; i < fh.numel(); ++i) REQUIRE(fh[i] == 1.5f);
}

TEST_CASE("ops on the emulated device equal the host's bit for bit", "[emulated]") {
  const kernels::Ctx& host = test::kernel_ctx();
  const kernels::Ctx& dev = emulated_ctx();
  const int64_t M = 37, N = 29, K = 41;
  const Tensor a = random_tensor({M, K}, "emul.a"), b = random_tensor({K, N}, "emul.b");
  Tensor c_host(std::vector<int64_t>{M, N});
  kernels::sgemm(host, false, false, M, N, K, 1.0f, a.ptr(), K, b.ptr(), N, 0.0f, c_host.ptr(), N);
  const Tensor a_d = kernels::clone(dev, a), b_d = kernels::clone(dev, b);
  Tensor c_d = kernels::empty(dev, {M, N});
  kernels::sgemm(dev, false, false, M, N, K, 1.0f, a_d.ptr(), K, b_d.ptr(), N, 0.0f, c_d.ptr(), N);
  CHECK(same_bits(kernels::to_host(dev, c_d), c_host));

  // attention through the workspace, and a reduction that returns to the host
  kernels::AttnShape s;
  s.Tq = s.Tk = 70;
  s.H = 4;
  s.Hkv = 2;
  s.D = 16;
  s.scale = 0.25f;
  s.causal = true;
  const Tensor q = random_tensor({s.Tq, s.H, s.D}, "emul.q"),
               k = random_tensor({s.Tk, s.Hkv, s.D}, "emul.k"),
               v = random_tensor({s.Tk, s.Hkv, s.D}, "emul.v");
  Tensor out_h(std::vector<int64_t>{s.Tq, s.H, s.D}), lse_h(std::vector<int64_t>{s.H, s.Tq});
  kernels::attention_forward(host, s, q.ptr(), k.ptr(), v.ptr(), out_h.ptr(), lse_h.ptr());
  const Tensor q_d = kernels::clone(dev, q), k_d = kernels::clone(dev, k),
               v_d = kernels::clone(dev, v);
  Tensor out_d = kernels::empty(dev, {s.Tq, s.H, s.D}), lse_d = kernels::empty(dev, {s.H, s.Tq});
  kernels::attention_forward(dev, s, q_d.ptr(), k_d.ptr(), v_d.ptr(), out_d.ptr(), lse_d.ptr());
  CHECK(same_bits(kernels::to_host(dev, out_d), out_h));
  CHECK(same_bits(kernels::to_host(dev, lse_d), lse_h));
  const double ss_h = kernels::sum_squares(host, out_h.ptr(), out_h.numel());
  const double ss_d = kernels::sum_squares(dev, out_d.ptr(), out_d.numel());
  CHECK(std::memcmp(&ss_h, &ss_d, sizeof ss_h) == 0);

  // an MoE op (moe_ops.cpp routes through the same rule)
  kernels::RouterDims dims;
  dims.T = 33;
  dims.E = 8;
  dims.k = 2;
  const Tensor logits = random_tensor({dims.T, dims.E}, "emul.logits");
  Tensor probs_h(std::vector<int64_t>{dims.T, dims.E}), lse_rh(std::vector<int64_t>{dims.T});
  kernels::router_scores(host, dims, logits.ptr(), probs_h.ptr(), lse_rh.ptr());
  const Tensor logits_d = kernels::clone(dev, logits);
  Tensor probs_d = kernels::empty(dev, {dims.T, dims.E}), lse_rd = kernels::empty(dev, {dims.T});
  kernels::router_scores(dev, dims, logits_d.ptr(), probs_d.ptr(), lse_rd.ptr());
  CHECK(same_bits(kernels::to_host(dev, probs_d), probs_h));
  CHECK(same_bits(kernels::to_host(dev, lse_rd), lse_rh));
}

TEST_CASE("an op's output is closed to host code once the op returns", "[emulated]") {
  const kernels::Ctx& dev = emulated_ctx();
  Tensor t = kernels::zeros(dev, {16});
  CHECK_FALSE(emulated::guard_lifted());
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, STDERR_FILENO);
    _exit(static_cast<volatile float*>(t.ptr())[3] == 0.0f ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == emulated::kFaultExitCode);
}

TEST_CASE("an op given host memory on the emulated device ends the process with one line",
          "[emulated]") {
  // What a GPU kernel handed a host pointer would fault on: the routing
  // checks every memory argument of an op on the emulated device.
  const kernels::Ctx& dev = emulated_ctx();
  Tensor x = kernels::zeros(dev, {4, 8});
  Tensor out = kernels::empty(dev, {2, 8});
  const std::vector<int64_t> host_rows{1, 3};  // index data left on the host
  std::fflush(nullptr);
  int pipe_fd[2];
  REQUIRE(pipe(pipe_fd) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(pipe_fd[0]);
    dup2(pipe_fd[1], STDERR_FILENO);
    kernels::gather_rows(dev, x.ptr(), 8, host_rows.data(), 2, out.ptr());
    _exit(0);
  }
  close(pipe_fd[1]);
  std::string err;
  char buf[512];
  for (ssize_t got; (got = read(pipe_fd[0], buf, sizeof buf)) > 0;) err.append(buf, size_t(got));
  close(pipe_fd[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == emulated::kFaultExitCode);
  INFO(err);
  CHECK(err.find("kernels::gather_rows was given host memory") != std::string::npos);
  CHECK(err.find("argument 3") != std::string::npos);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  // The same op with its index data on the device runs.
  Tensor rows = kernels::from_host(dev, host_rows.data(), {2}, DType::i64);
  kernels::gather_rows(dev, x.ptr(), 8, rows.data<int64_t>(), 2, out.ptr());
}
