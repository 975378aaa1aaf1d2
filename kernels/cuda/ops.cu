// The small ops of kernels/ops.hpp on the GPU: RMSNorm, RoPE, embedding,
// cross-entropy, AdamW, add_inplace, sum of squares, bf16 conversion. Each
// follows its CPU twin's arithmetic (the same fp64 row statistics, the same
// order where a sum is sequential) so that fp32 results agree to 1e-5.
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "common.cuh"

namespace trident::kernels::cuda {
namespace {

#define GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

__global__ void rmsnorm_forward_kernel(const float* x, const float* w, int64_t d, float eps,
                                       float* y, float* rstd) {
  __shared__ double red[32];
  const float* xr = x + blockIdx.x * d;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ss += double(xr[i]) * double(xr[i]);
  ss = block_sum(ss, red);
  const float r = float(1.0 / sqrt(ss / double(d) + double(eps)));
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  float* yr = y + blockIdx.x * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

__global__ void rmsnorm_backward_dx_kernel(const float* dy, const float* x, const float* w,
                                           const float* rstd, int64_t d, float* dx) {
  __shared__ double red[32];
  const int64_t off = blockIdx.x * d;
  const float r = rstd[blockIdx.x];
  double dot = 0.0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    dot += double(dy[off + i]) * double(w[i]) * double(x[off + i]) * r;
  dot = block_sum(dot, red);
  const float mean = float(dot / double(d));
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float xhat = x[off + i] * r;
    dx[off + i] = r * (dy[off + i] * w[i] - xhat * mean);
  }
}

// dw[i] += sum over rows of dy * xhat, in two passes without atomics (the
// same bits on every run): each block takes kDwCols columns of one chunk of
// rows (plan::rmsnorm_dw_chunks), its kDwRowLanes lanes per column summing
// every kDwRowLanes-th row, and adds the lanes in a fixed order (a block
// reduction) into the chunk's partial; the second pass adds each column's
// chunk partials in chunk order. Coalesced: a warp reads 32 neighbouring
// columns of one row.
constexpr int kDwCols = 32, kDwRowLanes = 8;
__global__ void rmsnorm_dw_partial_kernel(const float* dy, const float* x, const float* rstd,
                                          int64_t T, int64_t d, int64_t rows_per_chunk,
                                          double* partial) {
  __shared__ double red[kDwRowLanes][kDwCols + 1];
  const int64_t col = blockIdx.x * int64_t(kDwCols) + threadIdx.x;
  const int64_t t0 = blockIdx.y * rows_per_chunk, t1 = min(T, t0 + rows_per_chunk);
  double acc = 0.0;
  if (col < d)
    for (int64_t t = t0 + threadIdx.y; t < t1; t += kDwRowLanes)
      acc += double(dy[t * d + col]) * double(x[t * d + col] * rstd[t]);
  red[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= d) return;
  double sum = 0.0;
  for (int lane = 0; lane < kDwRowLanes; ++lane) sum += red[lane][threadIdx.x];
  partial[blockIdx.y * d + col] = sum;
}
__global__ void rmsnorm_dw_sum_kernel(const double* partial, int64_t chunks, int64_t d, float* dw) {
  GRID_STRIDE(i, d) {
    double sum = 0.0;
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * d + i];
    dw[i] += float(sum);
  }
}

// One thread per (token, head, pair); the angle in fp64 from the global
// position as on the CPU.
__global__ void rope_kernel(float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                            RopeFreqs freqs, double sign) {
  const int64_t half = D / 2;
  GRID_STRIDE(e, T * H * half) {
    const int64_t i = e % half, th = e / half, t = th / H;
    const double a = double(pos[t]) * rope_inv_freq(freqs, i, D);
    const float cs = float(cos(a)), sn = float(sign * sin(a));
    float* v = x + th * D;
    const float p = v[i], q = v[i + half];
    v[i] = p * cs - q * sn;
    v[i + half] = p * sn + q * cs;
  }
}

__global__ void embedding_forward_kernel(const float* table, const int32_t* ids, int64_t T,
                                         int64_t d, float* out) {
  GRID_STRIDE(e, T * d) out[e] = table[int64_t(ids[e / d]) * d + e % d];
}

// Tokens that share an id add into the same table row. After a stable sort
// of the tokens by id, each id's tokens form a run in token order; one
// thread per (run, column) adds its run in that order, so the additions
// happen in the CPU kernel's order (the same bits, every run: no atomics)
// while the runs, the table's rows, go in parallel. A run is summed by one
// thread rather than a block reduction, which would change the order: runs
// are short (a token's share of a batch), and equal bits with the CPU are
// worth more than the longest run's latency.
__global__ void iota_kernel(int32_t* v, int64_t n) { GRID_STRIDE(i, n) v[i] = int32_t(i); }
__global__ void embedding_backward_runs_kernel(const float* dout, const int32_t* sorted_ids,
                                               const int32_t* sorted_tokens, int64_t T, int64_t d,
                                               float* dtable) {
  const int64_t col = blockIdx.y * int64_t(blockDim.x) + threadIdx.x;
  if (col >= d) return;
  for (int64_t p = blockIdx.x; p < T; p += gridDim.x) {
    const int32_t id = sorted_ids[p];
    // Inside a run: the thread of the run's first token adds this one.
    if (p > 0 && sorted_ids[p - 1] == id) continue;
    float* row = dtable + int64_t(id) * d;
    float acc = row[col];
    for (int64_t q = p; q < T && sorted_ids[q] == id; ++q)
      acc += dout[int64_t(sorted_tokens[q]) * d + col];
    row[col] = acc;
  }
}

// One block per row: the row's loss into loss[t] (0 for a non-target row)
// and its gradient.
__global__ void cross_entropy_kernel(const float* logits, const int32_t* targets, int64_t V,
                                     float scale, float* dlogits, double* loss) {
  __shared__ double dred[32];
  __shared__ float fred[32];
  const int64_t t = blockIdx.x;
  const float* z = logits + t * V;
  float* dz = dlogits ? dlogits + t * V : nullptr;
  const int32_t target = targets[t];
  if (target < 0) {
    if (dz)
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dz[j] = 0.0f;
    if (threadIdx.x == 0) loss[t] = 0.0;
    return;
  }
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx, fred);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) sum += exp(double(z[j] - mx));
  sum = block_sum(sum, dred);
  const double lse = double(mx) + log(sum);
  if (threadIdx.x == 0) loss[t] = lse - double(z[target]);
  if (!dz) return;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = scale * float(exp(double(z[j]) - lse));
    dz[j] = j == target ? p - scale : p;
  }
}

// Sums n doubles in one block, in a fixed order (deterministic).
__global__ void sum_doubles_kernel(const double* x, int64_t n, double* out) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *out = s;
}

struct AdamWScalars {
  float b1, b2, eps, step_size, inv_sqrt_bc2, wd, grad_scale;
};

AdamWScalars adamw_scalars(const AdamWHyper& h, int64_t step, float grad_scale, bool decay) {
  const double bc1 = 1.0 - std::pow(h.beta1, double(step));
  const double bc2 = 1.0 - std::pow(h.beta2, double(step));
  return {float(h.beta1),
          float(h.beta2),
          float(h.eps),
          float(h.lr / bc1),
          float(1.0 / std::sqrt(bc2)),
          decay ? float(h.lr * h.weight_decay) : 0.0f,
          grad_scale};
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, __nv_bfloat16* p16,
                             int64_t n, AdamWScalars a) {
  GRID_STRIDE(i, n) {
    const float gi = g[i] * a.grad_scale;
    const float mi = a.b1 * m[i] + (1.0f - a.b1) * gi;
    const float vi = a.b2 * v[i] + (1.0f - a.b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) * a.inv_sqrt_bc2 + a.eps;
    float pi = p[i];
    pi -= a.wd * pi;
    pi -= a.step_size * mi / denom;
    p[i] = pi;
    if (p16) p16[i] = __float2bfloat16(pi);
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) { GRID_STRIDE(i, n) y[i] += x[i]; }

__global__ void fill_kernel(float* x, int64_t n, float value) { GRID_STRIDE(i, n) x[i] = value; }

// Two passes, no atomics, so the sum is the same bits on every run: each
// block's partial (a fixed grid-stride share), then one block adds the
// partials in a fixed order into *out.
__global__ void sum_squares_partial_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double red[32];
  double s = 0.0;
  GRID_STRIDE(i, n) s += double(x[i]) * double(x[i]);
  s = block_sum(s, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void add_partials_kernel(const double* partial, int64_t n, double* out) {
  __shared__ double red[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, red);
  if (threadIdx.x == 0) *out += s;
}

// sum_squares_ranges: kRangeSlices blocks per range each sum a fixed
// grid-stride share of it; one thread per range adds its slices in order.
constexpr int kRangeSlices = 64;
__global__ void range_partial_kernel(const float* x, const int64_t* ranges, double* partial) {
  __shared__ double red[32];
  const int64_t b = ranges[2 * blockIdx.y], e = ranges[2 * blockIdx.y + 1];
  double s = 0.0;
  for (int64_t i = b + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < e;
       i += int64_t(kRangeSlices) * blockDim.x)
    s += double(x[i]) * double(x[i]);
  s = block_sum(s, red);
  if (threadIdx.x == 0) partial[blockIdx.y * int64_t(kRangeSlices) + blockIdx.x] = s;
}
__global__ void range_sum_kernel(const double* partial, int64_t count, double* sums) {
  GRID_STRIDE(k, count) {
    double s = 0.0;
    for (int j = 0; j < kRangeSlices; ++j) s += partial[k * kRangeSlices + j];
    sums[k] = s;
  }
}

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* y) {
  GRID_STRIDE(i, n) y[i] = __float2bfloat16(x[i]);
}
__global__ void to_f32_kernel(const __nv_bfloat16* x, int64_t n, float* y) {
  GRID_STRIDE(i, n) y[i] = __bfloat162float(x[i]);
}

#undef GRID_STRIDE

void rope(const Ctx& c, float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
          const RopeFreqs& freqs, double sign) {
  const int64_t n = T * H * (D / 2);
  if (n == 0) return;
  rope_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(x, pos, T, H, D, freqs, sign);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(const Ctx& c, const float* x, const float* w, int64_t T, int64_t d, float eps,
                     float* y, float* rstd) {
  if (T == 0) return;
  rmsnorm_forward_kernel<<<unsigned(T), plan::row_threads(d), 0, stream_of(c)>>>(x, w, d, eps, y,
                                                                                 rstd);
  CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(const Ctx& c, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t d, float* dx, float* dw) {
  if (T == 0) return;
  rmsnorm_backward_dx_kernel<<<unsigned(T), plan::row_threads(d), 0, stream_of(c)>>>(dy, x, w, rstd,
                                                                                     d, dx);
  CUDA_CHECK_LAUNCH();
  if (!dw) return;
  const int64_t chunks = plan::rmsnorm_dw_chunks(T), rows = (T + chunks - 1) / chunks;
  Scratch partial(c, size_t(chunks * d) * sizeof(double));
  const dim3 grid(unsigned((d + kDwCols - 1) / kDwCols), unsigned(chunks));
  rmsnorm_dw_partial_kernel<<<grid, dim3(kDwCols, kDwRowLanes), 0, stream_of(c)>>>(
      dy, x, rstd, T, d, rows, partial.as<double>());
  CUDA_CHECK_LAUNCH();
  rmsnorm_dw_sum_kernel<<<plan::grid_for(d), plan::kThreads, 0, stream_of(c)>>>(
      partial.as<double>(), chunks, d, dw);
  CUDA_CHECK_LAUNCH();
}

void rope_forward(const Ctx& c, float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                  const RopeFreqs& freqs) {
  rope(c, x, pos, T, H, D, freqs, 1.0);
}

void rope_backward(const Ctx& c, float* dx, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                   const RopeFreqs& freqs) {
  rope(c, dx, pos, T, H, D, freqs, -1.0);
}

void embedding_forward(const Ctx& c, const float* table, const int32_t* ids, int64_t T, int64_t d,
                       float* out) {
  if (T * d == 0) return;
  embedding_forward_kernel<<<plan::grid_for(T * d), plan::kThreads, 0, stream_of(c)>>>(table, ids,
                                                                                       T, d, out);
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(const Ctx& c, const float* dout, const int32_t* ids, int64_t T, int64_t d,
                        float* dtable) {
  if (T * d == 0) return;
  TRIDENT_CHECK(plan::fits_int32(T), "embedding_backward: " + std::to_string(T) + " tokens");
  // One scratch block (a second workspace get() could move the first):
  // sorted ids, token indices before and after the sort, the sort's own.
  const int n = int(T);
  size_t sort_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, ids, (int32_t*)nullptr,
                                             (const int32_t*)nullptr, (int32_t*)nullptr, n, 0,
                                             int(sizeof(int32_t) * 8), stream_of(c)));
  const size_t ints = plan::round_up(size_t(n) * sizeof(int32_t), 256);
  Scratch buf(c, 3 * ints + sort_bytes);
  char* base = buf.as<char>();
  auto* sorted_ids = reinterpret_cast<int32_t*>(base);
  auto* tokens = reinterpret_cast<int32_t*>(base + ints);
  auto* sorted_tokens = reinterpret_cast<int32_t*>(base + 2 * ints);
  iota_kernel<<<plan::grid_for(T), plan::kThreads, 0, stream_of(c)>>>(tokens, T);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * ints, sort_bytes, ids, sorted_ids, tokens,
                                             sorted_tokens, n, 0, int(sizeof(int32_t) * 8),
                                             stream_of(c)));
  const int threads = plan::row_threads(d);
  const dim3 grid(plan::grid_for(T, 1), unsigned((d + threads - 1) / threads));
  embedding_backward_runs_kernel<<<grid, threads, 0, stream_of(c)>>>(dout, sorted_ids,
                                                                     sorted_tokens, T, d, dtable);
  CUDA_CHECK_LAUNCH();
}

double cross_entropy(const Ctx& c, const float* logits, const int32_t* targets, int64_t T,
                     int64_t V, float scale, float* dlogits) {
  if (T == 0) return 0.0;
  Scratch loss(c, size_t(T + 1) * sizeof(double));
  double* rows = loss.as<double>();
  cross_entropy_kernel<<<unsigned(T), plan::row_threads(V), 0, stream_of(c)>>>(
      logits, targets, V, scale, dlogits, rows);
  CUDA_CHECK_LAUNCH();
  sum_doubles_kernel<<<1, plan::kThreads, 0, stream_of(c)>>>(rows, T, rows + T);
  CUDA_CHECK_LAUNCH();
  double total = 0.0;
  copy_to_host(c, &total, rows + T, sizeof total);
  return total;
}

void adamw_step(const Ctx& c, float* p, const float* g, float* m, float* v, int64_t n,
                const AdamWHyper& h, int64_t step, float grad_scale, bool decay) {
  adamw_step_bf16(c, p, g, m, v, nullptr, n, h, step, grad_scale, decay);
}

void adamw_step_bf16(const Ctx& c, float* p, const float* g, float* m, float* v, Bf16* p_bf16,
                     int64_t n, const AdamWHyper& h, int64_t step, float grad_scale, bool decay) {
  if (n == 0) return;
  adamw_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(
      p, g, m, v, dev(p_bf16), n, adamw_scalars(h, step, grad_scale, decay));
  CUDA_CHECK_LAUNCH();
}

void add_inplace(const Ctx& c, float* y, const float* x, int64_t n) {
  if (n == 0) return;
  add_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(y, x, n);
  CUDA_CHECK_LAUNCH();
}

void copy(const Ctx& c, float* dst, const float* src, int64_t n) {
  copy_device(c, dst, src, size_t(n) * sizeof(float));
}

void fill(const Ctx& c, float* x, int64_t n, float value) {
  if (n == 0) return;
  fill_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(x, n, value);
  CUDA_CHECK_LAUNCH();
}

void sum_squares_into(const Ctx& c, const float* x, int64_t n, double* out) {
  if (n == 0) return;
  const unsigned blocks = plan::grid_for(n);
  Scratch partial(c, blocks * sizeof(double), /*may_use_workspace=*/false);  // out may be there
  sum_squares_partial_kernel<<<blocks, plan::kThreads, 0, stream_of(c)>>>(x, n,
                                                                          partial.as<double>());
  CUDA_CHECK_LAUNCH();
  add_partials_kernel<<<1, plan::kThreads, 0, stream_of(c)>>>(partial.as<double>(), blocks, out);
  CUDA_CHECK_LAUNCH();
}

double sum_squares(const Ctx& c, const float* x, int64_t n) {
  Scratch acc(c, sizeof(double));
  fill_zero(c, acc.as<double>(), sizeof(double));
  sum_squares_into(c, x, n, acc.as<double>());
  double s = 0.0;
  copy_to_host(c, &s, acc.as<double>(), sizeof s);
  return s;
}

void sum_squares_ranges(const Ctx& c, const float* x, const int64_t* ranges, int64_t count,
                        double* sums) {
  if (count == 0) return;
  TRIDENT_CHECK(count <= plan::kMaxBlocks, "sum_squares_ranges: " + std::to_string(count) +
                                               " ranges, more than one launch takes");
  Scratch partial(c, size_t(count * kRangeSlices) * sizeof(double));
  range_partial_kernel<<<dim3(kRangeSlices, unsigned(count)), plan::kThreads, 0, stream_of(c)>>>(
      x, ranges, partial.as<double>());
  CUDA_CHECK_LAUNCH();
  range_sum_kernel<<<plan::grid_for(count), plan::kThreads, 0, stream_of(c)>>>(partial.as<double>(),
                                                                               count, sums);
  CUDA_CHECK_LAUNCH();
}

void to_bf16(const Ctx& c, const float* x, int64_t n, Bf16* y) {
  if (n == 0) return;
  to_bf16_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(x, n, dev(y));
  CUDA_CHECK_LAUNCH();
}

void to_f32(const Ctx& c, const Bf16* x, int64_t n, float* y) {
  if (n == 0) return;
  to_f32_kernel<<<plan::grid_for(n), plan::kThreads, 0, stream_of(c)>>>(dev(x), n, y);
  CUDA_CHECK_LAUNCH();
}

}  // namespace trident::kernels::cuda
