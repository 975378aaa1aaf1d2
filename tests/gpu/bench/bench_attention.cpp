// Attention throughput on one GPU: trident's CUDA flash attention in bf16
// (head_dim 128, seq 4k/8k/16k, causal and full, forward and forward +
// backward), next to the cuBLAS bf16 GEMM rate and, when given, PyTorch's
// scaled_dot_product_attention measured by sdpa_bench.py in the same run.
//
//   trident_gpu_bench [--torch FILE] [--heads H] [--iters N] [--smoke]
//
// FLOPs count only the pairs the mask lets through (kernels::attention_flops:
// 4·D per pair forward, 10·D backward), the same count sdpa_bench.py uses.
// The backward's rate is its FLOPs over (forward + backward time) minus
// (forward time), for trident and torch alike.
// Exit 77 (SKIP) without a device, 1 on an error, else 0.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/cuda/ops.hpp"
#include "trident/kernels/cuda/runtime.hpp"

namespace cuda = trident::kernels::cuda;
using trident::kernels::AttnShape;

namespace {

struct Options {
  std::string torch_file;
  int heads = 16, iters = 5;
  bool smoke = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw trident::InputError("trident_gpu_bench: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--torch")
      o.torch_file = value();
    else if (a == "--heads")
      o.heads = std::stoi(value());
    else if (a == "--iters")
      o.iters = std::stoi(value());
    else if (a == "--smoke")
      o.smoke = true;
    else
      throw trident::InputError("trident_gpu_bench: unknown flag " + a);
  }
  if (o.heads < 1 || o.iters < 1)
    throw trident::InputError("trident_gpu_bench: --heads and --iters must be >= 1");
  return o;
}

// Median milliseconds of `iters` runs of fn on the context's stream (one
// warm-up run first), timed with CUDA events.
template <class Fn>
double median_ms(cuda::StreamContext& dc, int iters, Fn&& fn) {
  fn();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    cuda::Event a, b;
    a.record(dc.stream().get());
    fn();
    b.record(dc.stream().get());
    b.wait(600.0, "benchmark iteration");
    ms.push_back(b.elapsed_ms(a));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

template <class T>
T* alloc(cuda::StreamContext& dc, size_t n) {
  auto* p = static_cast<T*>(dc.allocator().allocate(n * sizeof(T)));
  cuda::fill_zero(dc.ctx(), p, n * sizeof(T));
  return p;
}

// Device data with small deterministic values (a bf16 pattern, not zeros).
void fill_pattern(cuda::StreamContext& dc, cuda::Bf16* p, size_t n, uint32_t seed) {
  std::vector<float> host(n);
  uint32_t x = seed * 2654435761u + 1u;
  for (auto& v : host) {
    x = x * 1664525u + 1013904223u;
    v = float(int(x >> 8) % 2001 - 1000) / 1000.0f;
  }
  float* tmp = alloc<float>(dc, n);
  cuda::copy_to_device(dc.ctx(), tmp, host.data(), n * sizeof(float));
  cuda::to_bf16(dc.ctx(), tmp, int64_t(n), p);
  cuda::synchronize(dc.ctx(), 120.0, "benchmark input");
  dc.allocator().deallocate(tmp, n * sizeof(float));
}

double gemm_tflops(cuda::StreamContext& dc, int iters) {
  const int64_t n = 8192;
  auto* a = alloc<cuda::Bf16>(dc, size_t(n * n));
  auto* b = alloc<cuda::Bf16>(dc, size_t(n * n));
  auto* c = alloc<cuda::Bf16>(dc, size_t(n * n));
  fill_pattern(dc, a, size_t(n * n), 1);
  fill_pattern(dc, b, size_t(n * n), 2);
  const double ms = median_ms(dc, iters, [&] {
    cuda::gemm_bf16_out(dc.ctx(), false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
  });
  for (auto* p : {a, b, c}) dc.allocator().deallocate(p, size_t(n * n) * sizeof(cuda::Bf16));
  return 2.0 * double(n) * n * n / (ms * 1e-3) / 1e12;
}

// "seq causal|full fwd|fwdbwd tflops" lines from sdpa_bench.py.
std::map<std::string, double> read_torch(const std::string& file) {
  std::map<std::string, double> rates;
  if (file.empty()) return rates;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string seq, mask, pass;
    double tf = 0.0;
    if (ls >> seq >> mask >> pass >> tf) rates[seq + " " + mask + " " + pass] = tf;
  }
  return rates;
}

// One shape's measurement: FLOPs of the forward and the backward and the
// median times of the forward alone and of forward + backward.
struct Row {
  double fwd_flops, bwd_flops, fwd_ms, all_ms;
};

// TFLOP/s of the three passes (fwd, bwd, fwd+bwd); the backward's time is
// the difference of the two timed runs. -1 where not measurable.
struct Rates {
  double pass[3];
};
Rates rates_of(double f, double b, double fwd_ms, double all_ms) {
  const double bwd_ms = all_ms - fwd_ms;
  return {{f / (fwd_ms * 1e-3) / 1e12, bwd_ms > 0 ? b / (bwd_ms * 1e-3) / 1e12 : -1.0,
           (f + b) / (all_ms * 1e-3) / 1e12}};
}

Row measure(cuda::StreamContext& dc, int64_t seq, bool causal, int heads, int iters) {
  AttnShape s;
  s.Tq = s.Tk = seq;
  s.H = s.Hkv = heads;
  s.D = 128;
  s.scale = 1.0f / std::sqrt(128.0f);
  s.causal = causal;
  const size_t n = size_t(seq) * heads * 128;
  auto* q = alloc<cuda::Bf16>(dc, n);
  auto* k = alloc<cuda::Bf16>(dc, n);
  auto* v = alloc<cuda::Bf16>(dc, n);
  auto* o = alloc<cuda::Bf16>(dc, n);
  auto* dout = alloc<cuda::Bf16>(dc, n);
  auto* lse = alloc<float>(dc, size_t(seq) * heads);
  auto* dq = alloc<float>(dc, n);
  auto* dk = alloc<float>(dc, n);
  auto* dv = alloc<float>(dc, n);
  fill_pattern(dc, q, n, 3);
  fill_pattern(dc, k, n, 4);
  fill_pattern(dc, v, n, 5);
  fill_pattern(dc, dout, n, 6);
  const double fwd_ms =
      median_ms(dc, iters, [&] { cuda::attention_forward_bf16(dc.ctx(), s, q, k, v, o, lse); });
  const double all_ms = median_ms(dc, iters, [&] {
    cuda::attention_forward_bf16(dc.ctx(), s, q, k, v, o, lse);
    cuda::attention_backward_bf16(dc.ctx(), s, q, k, v, o, lse, dout, dq, dk, dv);
  });
  for (auto* p : {q, k, v, o, dout}) dc.allocator().deallocate(p, n * sizeof(cuda::Bf16));
  for (auto* p : {dq, dk, dv}) dc.allocator().deallocate(p, n * sizeof(float));
  dc.allocator().deallocate(lse, size_t(seq) * heads * sizeof(float));
  return {trident::kernels::attention_flops(s, false), trident::kernels::attention_flops(s, true),
          fwd_ms, all_ms};
}

// torch's rates for one shape from its fwd and fwd+bwd rates (the same
// FLOP counts), or all -1 when the file has no such row.
Rates torch_rates(const std::map<std::string, double>& torch, const std::string& key,
                  const Row& r) {
  const auto f = torch.find(key + " fwd"), fb = torch.find(key + " fwdbwd");
  if (f == torch.end() || fb == torch.end() || f->second <= 0 || fb->second <= 0)
    return {{-1.0, -1.0, -1.0}};
  const double fwd_ms = r.fwd_flops / (f->second * 1e12) * 1e3;
  const double all_ms = (r.fwd_flops + r.bwd_flops) / (fb->second * 1e12) * 1e3;
  return rates_of(r.fwd_flops, r.bwd_flops, fwd_ms, all_ms);
}

void print_rate(int64_t seq, const char* mask, const char* pass, double tf, double gemm,
                double torch_tf) {
  std::printf("%6lld %-6s %-7s ", (long long)seq, mask, pass);
  if (tf < 0)
    std::printf("%9s %7s ", "-", "-");
  else
    std::printf("%9.1f %6.0f%% ", tf, 100.0 * tf / gemm);
  if (torch_tf < 0)
    std::printf("%9s %8s\n", "-", "-");
  else if (tf < 0)
    std::printf("%9.1f %8s\n", torch_tf, "-");
  else
    std::printf("%9.1f %7.2fx\n", torch_tf, tf / torch_tf);
}

int run(const Options& o) {
  if (cuda::device_count() == 0) {
    std::printf("SKIP: no CUDA device visible (%s)\n", cuda::no_device_reason().c_str());
    return 77;
  }
  cuda::StreamContext dc(0);
  const double gemm = gemm_tflops(dc, o.iters);
  const auto torch = read_torch(o.torch_file);
  std::vector<int64_t> seqs = {4096, 8192, 16384};
  if (o.smoke) seqs = {1024};
  std::printf("cuBLAS bf16 GEMM 8192^3: %.1f TFLOP/s\n", gemm);
  std::printf("attention bf16, head_dim 128, %d heads, batch 1 (TFLOP/s; %% of the GEMM rate)\n",
              o.heads);
  std::printf("%6s %-6s %-7s %9s %7s %9s %8s\n", "seq", "mask", "pass", "trident", "%gemm", "torch",
              "vs torch");
  for (int64_t seq : seqs)
    for (bool causal : {true, false}) {
      const Row r = measure(dc, seq, causal, o.heads, o.iters);
      const char* mask = causal ? "causal" : "full";
      const Rates mine = rates_of(r.fwd_flops, r.bwd_flops, r.fwd_ms, r.all_ms);
      const Rates theirs = torch_rates(torch, std::to_string(seq) + " " + mask, r);
      const char* names[3] = {"fwd", "bwd", "fwd+bwd"};
      for (int p = 0; p < 3; ++p)
        print_rate(seq, mask, names[p], mine.pass[p], gemm, theirs.pass[p]);
    }
  std::printf("targets: forward >= 50%% and backward >= 35%% of the GEMM rate, >= torch SDPA\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const trident::InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident_gpu_bench: %s\n", e.what());
    return 1;
  }
}
