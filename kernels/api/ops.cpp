// The public ops: each routes its call to the backend of ctx.device
// (route.hpp, shared with moe_ops.cpp); model and parallel code call these
// and never name a backend.
#include "route.hpp"
#include "trident/kernels/backends.hpp"

namespace trident::kernels {

void sgemm(const Ctx& ctx, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
           const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
           int64_t ldc) {
  TRIDENT_ROUTE(sgemm, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void attention_forward(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                       const float* v, float* out, float* lse) {
  TRIDENT_ROUTE(attention_forward, s, q, k, v, out, lse);
}

void attention_forward_resume(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                              const float* v, float* out, float* lse) {
  TRIDENT_ROUTE(attention_forward_resume, s, q, k, v, out, lse);
}

void attention_backward(const Ctx& ctx, const AttnShape& s, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv) {
  TRIDENT_ROUTE(attention_backward, s, q, k, v, out, lse, dout, dq, dk, dv);
}

void merge_partial_attention(const Ctx& ctx, int64_t n_rows, int D, float* out, float* lse,
                             const float* out_b, const float* lse_b) {
  TRIDENT_ROUTE(merge_partial_attention, n_rows, D, out, lse, out_b, lse_b);
}

void swiglu_forward(const Ctx& ctx, const float* x, int64_t T, int64_t d, int64_t f,
                    const float* w_gate, const float* w_up, const float* w_down, float* y,
                    float* gate, float* up) {
  TRIDENT_ROUTE(swiglu_forward, x, T, d, f, w_gate, w_up, w_down, y, gate, up);
}

void swiglu_backward(const Ctx& ctx, const float* x, const float* gate, const float* up,
                     const float* dy, int64_t T, int64_t d, int64_t f, const float* w_gate,
                     const float* w_up, const float* w_down, float* dx, float* dw_gate,
                     float* dw_up, float* dw_down) {
  TRIDENT_ROUTE(swiglu_backward, x, gate, up, dy, T, d, f, w_gate, w_up, w_down, dx, dw_gate, dw_up,
                dw_down);
}

void linear_forward(const Ctx& ctx, const float* x, const float* w, int64_t T, int64_t in,
                    int64_t out, float* y) {
  TRIDENT_ROUTE(linear_forward, x, w, T, in, out, y);
}

void linear_backward_input(const Ctx& ctx, const float* dy, const float* w, int64_t T, int64_t in,
                           int64_t out, float* dx, float beta) {
  TRIDENT_ROUTE(linear_backward_input, dy, w, T, in, out, dx, beta);
}

void linear_backward_weight(const Ctx& ctx, const float* dy, const float* x, int64_t T, int64_t in,
                            int64_t out, float* dw) {
  TRIDENT_ROUTE(linear_backward_weight, dy, x, T, in, out, dw);
}

void rmsnorm_forward(const Ctx& ctx, const float* x, const float* w, int64_t T, int64_t d,
                     float eps, float* y, float* rstd) {
  TRIDENT_ROUTE(rmsnorm_forward, x, w, T, d, eps, y, rstd);
}

void rmsnorm_backward(const Ctx& ctx, const float* dy, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t d, float* dx, float* dw) {
  TRIDENT_ROUTE(rmsnorm_backward, dy, x, w, rstd, T, d, dx, dw);
}

void rope_forward(const Ctx& ctx, float* x, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                  const RopeFreqs& freqs) {
  TRIDENT_ROUTE(rope_forward, x, pos, T, H, D, freqs);
}

void rope_backward(const Ctx& ctx, float* dx, const int64_t* pos, int64_t T, int64_t H, int64_t D,
                   const RopeFreqs& freqs) {
  TRIDENT_ROUTE(rope_backward, dx, pos, T, H, D, freqs);
}

void embedding_forward(const Ctx& ctx, const float* table, const int32_t* ids, int64_t T, int64_t d,
                       float* out) {
  TRIDENT_ROUTE(embedding_forward, table, ids, T, d, out);
}

void embedding_backward(const Ctx& ctx, const float* dout, const int32_t* ids, int64_t T, int64_t d,
                        float* dtable) {
  TRIDENT_ROUTE(embedding_backward, dout, ids, T, d, dtable);
}

double cross_entropy(const Ctx& ctx, const float* logits, const int32_t* targets, int64_t T,
                     int64_t V, float scale, float* dlogits) {
  TRIDENT_ROUTE(cross_entropy, logits, targets, T, V, scale, dlogits);
}

void adamw_step(const Ctx& ctx, float* p, const float* g, float* m, float* v, int64_t n,
                const AdamWHyper& h, int64_t step, float grad_scale, bool decay) {
  TRIDENT_ROUTE(adamw_step, p, g, m, v, n, h, step, grad_scale, decay);
}

void add_inplace(const Ctx& ctx, float* y, const float* x, int64_t n) {
  TRIDENT_ROUTE(add_inplace, y, x, n);
}

void copy(const Ctx& ctx, float* dst, const float* src, int64_t n) {
  TRIDENT_ROUTE(copy, dst, src, n);
}

void fill(const Ctx& ctx, float* x, int64_t n, float value) { TRIDENT_ROUTE(fill, x, n, value); }

double sum_squares(const Ctx& ctx, const float* x, int64_t n) { TRIDENT_ROUTE(sum_squares, x, n); }

void sum_squares_ranges(const Ctx& ctx, const float* x, const int64_t* ranges, int64_t count,
                        double* sums) {
  TRIDENT_ROUTE(sum_squares_ranges, x, ranges, count, sums);
}

void to_bf16(const Ctx& ctx, const float* x, int64_t n, uint16_t* y) {
  TRIDENT_ROUTE(to_bf16, x, n, y);
}

void from_bf16(const Ctx& ctx, const uint16_t* x, int64_t n, float* y) {
  TRIDENT_ROUTE(from_bf16, x, n, y);
}

#undef TRIDENT_ROUTE

}  // namespace trident::kernels
