// The benchmark engine's parts for one process's kernels (see
// trident/bench/engine.hpp, "one process's kernels"): the host named, and
// tensors drawn in f32 or bf16 with the values they hold.
#include <algorithm>
#include <fstream>

#include "trident/bench/engine.hpp"
#include "trident/core/rng.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"

namespace trident::bench {

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  return "unknown CPU";
}

Tensor drawn_tensor(const kernels::Ctx& ctx, const std::vector<int64_t>& shape, const char* stream,
                    DType dtype, std::vector<float>& values) {
  values.assign(size_t(Tensor::numel_of(shape)), 0.0f);
  rng::fill_normal(values.data(), int64_t(values.size()), rng::hash_name(stream), 0, 1.0f);
  Tensor f = kernels::from_host(ctx, values.data(), shape, DType::f32);
  if (dtype == DType::f32) return f;
  Tensor t = kernels::empty(ctx, shape, dtype);
  kernels::convert(ctx, f, t);
  kernels::convert(ctx, t, f);  // the values t holds
  std::copy_n(f.data<float>(), values.size(), values.begin());
  return t;
}

}  // namespace trident::bench
