// The CUDA implementations of the kernel interface (include/trident/kernels/
// *.hpp): same names, same argument order and the same contracts
// (accumulate/overwrite, layouts, -inf LSE rows), with the Ctx first. Every
// pointer is device memory of ctx.device; ops are enqueued on ctx.stream and
// return before they finish, except those that return a host value
// (cross_entropy, sum_squares), which wait for it with a deadline.
//
// fp32 ops are computed in fp32 (GEMMs through cuBLAS without TF32) so that
// they match the CPU reference to 1e-5. bf16 variants keep bf16 storage for
// the large operands and accumulate in fp32.
#pragma once
#include <cstdint>

#include "trident/kernels/attention.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/moe_backends.hpp"
#include "trident/kernels/ops.hpp"

namespace trident::kernels::cuda {

// bfloat16 storage as its 16 bits (the CUDA type stays out of this header).
struct Bf16 {
  uint16_t bits;
};

// ---- GEMM (row-major, as kernels/gemm.hpp) ----
void sgemm(const Ctx& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc);
// bf16 A and B, fp32 accumulation, C in fp32.
void gemm_bf16(const Ctx& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
               float alpha, const Bf16* A, int64_t lda, const Bf16* B, int64_t ldb, float beta,
               float* C, int64_t ldc);
// bf16 A, B and C (the benchmark's rate and bf16 activations).
void gemm_bf16_out(const Ctx& c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                   float alpha, const Bf16* A, int64_t lda, const Bf16* B, int64_t ldb, float beta,
                   Bf16* C, int64_t ldc);

// ---- ops.hpp ----
void linear_forward(const Ctx& c, const float* x, const float* w, int64_t T, int64_t in,
                    int64_t out, float* y);
void linear_backward_input(const Ctx& c, const float* dy, const float* w, int64_t T, int64_t in,
                           int64_t out, float* dx, float beta);
void linear_backward_weight(const Ctx& c, const float* dy, const float* x, int64_t T, int64_t in,
                            int64_t out, float* dw);
void rmsnorm_forward(const Ctx& c, const float* x, const float* w, int64_t T, int64_t d, float eps,
                     float* y, float* rstd);
void rmsnorm_backward(const Ctx& c, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t d, float* dx, float* dw);
void rope_forward(const Ctx& c, float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                  double theta);
void rope_backward(const Ctx& c, float* dx, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                   double theta);
void embedding_forward(const Ctx& c, const float* table, const int32_t* ids, int64_t T, int64_t d,
                       float* out);
void embedding_backward(const Ctx& c, const float* dout, const int32_t* ids, int64_t T, int64_t d,
                        float* dtable);
// The loss sum reaches the host (a deadline-guarded wait); the gradient stays
// on the device. dlogits may be null.
double cross_entropy(const Ctx& c, const float* logits, const int32_t* targets, int64_t T,
                     int64_t V, float scale, float* dlogits);
void adamw_step(const Ctx& c, float* p, const float* g, float* m, float* v, int64_t n,
                const AdamWHyper& h, int64_t step, float grad_scale, bool decay);
// The same update on fp32 master weights p, also writing their bf16 copy
// (the weights the bf16 GEMMs read).
void adamw_step_bf16(const Ctx& c, float* p, const float* g, float* m, float* v, Bf16* p_bf16,
                     int64_t n, const AdamWHyper& h, int64_t step, float grad_scale, bool decay);
void add_inplace(const Ctx& c, float* y, const float* x, int64_t n);
void copy(const Ctx& c, float* dst, const float* src, int64_t n);
void fill(const Ctx& c, float* x, int64_t n, float value);
double sum_squares(const Ctx& c, const float* x, int64_t n);
// Without the host wait: *out (device, fp64) += sum of squares, for adding
// up many parameters' norms before one transfer.
void sum_squares_into(const Ctx& c, const float* x, int64_t n, double* out);

// fp32 <-> bf16 (round to nearest even).
void to_bf16(const Ctx& c, const float* x, int64_t n, Bf16* y);
void to_f32(const Ctx& c, const Bf16* x, int64_t n, float* y);

// ---- swiglu.hpp (scratch from ctx.workspace: two [T, f] buffers) ----
void swiglu_forward(const Ctx& c, const float* x, int64_t T, int64_t d, int64_t f,
                    const float* w_gate, const float* w_up, const float* w_down, float* y,
                    float* gate, float* up);
void swiglu_backward(const Ctx& c, const float* x, const float* gate, const float* up,
                     const float* dy, int64_t T, int64_t d, int64_t f, const float* w_gate,
                     const float* w_up, const float* w_down, float* dx, float* dw_gate,
                     float* dw_up, float* dw_down);

// ---- attention.hpp (flash attention; head_dim up to 256) ----
void attention_forward(const Ctx& c, const AttnShape& s, const float* q, const float* k,
                       const float* v, float* out, float* lse);
void attention_forward_resume(const Ctx& c, const AttnShape& s, const float* q, const float* k,
                              const float* v, float* out, float* lse);
void attention_backward(const Ctx& c, const AttnShape& s, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv);
void merge_partial_attention(const Ctx& c, int64_t n_rows, int D, float* out, float* lse,
                             const float* out_b, const float* lse_b);
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
// of x ([rows, in]) times w[e] ([in, out], row-major) into the same rows of y
// ([rows, out]); beta as in sgemm. offsets are host values (E + 1 entries);
// an expert with no rows costs nothing.
void grouped_gemm(const Ctx& c, const float* x, const float* const* w, const int64_t* offsets,
                  int E, int64_t in, int64_t out, float beta, float* y);

}  // namespace trident::kernels::cuda
