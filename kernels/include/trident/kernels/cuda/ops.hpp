// The CUDA backend's own ops, beside the interface's list that
// backends.hpp declares in this namespace (backend_ops.inc, and
// moe_backend_ops.inc through moe_backends.hpp): the same names, argument
// order and contracts (accumulate/overwrite, layouts, -inf LSE rows) as the
// public ops, with the Ctx first. Every
// pointer is device memory of ctx.device; ops are enqueued on ctx.stream and
// return before they finish, except those that return a host value
// (cross_entropy, sum_squares), which wait for it with a deadline.
//
// fp32 ops are computed in fp32 (GEMMs through cuBLAS without TF32) so that
// they match the CPU reference to 1e-5. bf16 variants keep bf16 storage for
// the large operands and accumulate in fp32.
#pragma once
#include <cstdint>

#include "trident/kernels/backends.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/moe_backends.hpp"

namespace trident::kernels::cuda {

// bfloat16 storage as its 16 bits (the CUDA type stays out of this header).
struct Bf16 {
  uint16_t bits;
};

// On this backend (the list's ops are declared by backends.hpp):
// - cross_entropy and sum_squares bring their value to the host through a
//   deadline-guarded wait; cross_entropy's gradient stays on the device and
//   dlogits may be null;
// - swiglu_forward/backward take two [T, f] scratch buffers from ctx.workspace;
// - attention handles head_dim up to 256.

// ---- GEMM (row-major, as kernels/gemm.hpp) ----
// bf16 A and B, fp32 accumulation, C in fp32.
void gemm_bf16(const Ctx& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               float alpha, const Bf16* A, int64_t lda, const Bf16* B, int64_t ldb, float beta,
               float* C, int64_t ldc);
// bf16 A, B and C (the benchmark's rate and bf16 activations).
void gemm_bf16_out(const Ctx& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const Bf16* A, int64_t lda, const Bf16* B, int64_t ldb, float beta,
                   Bf16* C, int64_t ldc);

// ---- ops.hpp ----
// adamw_step on fp32 master weights p, also writing their bf16 copy (the
// weights the bf16 GEMMs read).
void adamw_step_bf16(const Ctx& c, float* p, const float* g, float* m, float* v, Bf16* p_bf16,
                     int64_t n, const AdamWHyper& h, int64_t step, float grad_scale, bool decay);
// Without the host wait: *out (device, fp64) += sum of squares, for adding
// up many parameters' norms before one transfer.
void sum_squares_into(const Ctx& c, const float* x, int64_t n, double* out);

// fp32 <-> bf16 (round to nearest even).
void to_bf16(const Ctx& c, const float* x, int64_t n, Bf16* y);
void to_f32(const Ctx& c, const Bf16* x, int64_t n, float* y);

// ---- attention.hpp ----
// bf16 q, k, v, out, dout; fp32 lse and fp32 gradients (accumulated).
void attention_forward_bf16(const Ctx& c, const AttnShape& s, const Bf16* q, const Bf16* k,
                            const Bf16* v, Bf16* out, float* lse);
void attention_forward_resume_bf16(const Ctx& c, const AttnShape& s, const Bf16* q, const Bf16* k,
                                   const Bf16* v, Bf16* out, float* lse);
void attention_backward_bf16(const Ctx& c, const AttnShape& s, const Bf16* q, const Bf16* k,
                             const Bf16* v, const Bf16* out, const float* lse, const Bf16* dout,
                             float* dq, float* dk, float* dv);

// ---- moe.hpp, router.hpp: declared with the CPU list (moe_backends.hpp) ----
// Grouped expert GEMM: for each expert e, the rows [offset[e], offset[e+1])
// of x ([rows, in]) times w[e]ᵀ (w[e] stored [out, in]) into the same rows of y
// ([rows, out]); beta as in sgemm. offsets are host values (E + 1 entries);
// an expert with no rows costs nothing.
void grouped_gemm(const Ctx& c, const float* x, const float* const* w, const int64_t* offsets,
                  int E, int64_t in, int64_t out, float beta, float* y);

}  // namespace trident::kernels::cuda
