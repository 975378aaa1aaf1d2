// The public MoE and router ops: each routes its call to the backend of
// ctx.device (route.hpp).
#include "route.hpp"
#include "trident/kernels/moe_backends.hpp"

namespace trident::kernels {

void gather_rows(const Ctx& ctx, const float* x, int64_t d, const int64_t* src_row, int64_t n,
                 float* out) {
  TRIDENT_ROUTE(gather_rows, x, d, src_row, n, out);
}
void combine_rows(const Ctx& ctx, const RowSource& rows, int64_t d, const int64_t* row,
                  const float* weight, int64_t T, int k, float* y) {
  TRIDENT_ROUTE(combine_rows, rows, d, row, weight, T, k, y);
}
void combine_rows_backward(const Ctx& ctx, const RowSource& rows, const float* dy, int64_t d,
                           const int64_t* row, const float* weight, int64_t T, int k, float* drows,
                           float* dweight) {
  TRIDENT_ROUTE(combine_rows_backward, rows, dy, d, row, weight, T, k, drows, dweight);
}
void scatter_add_rows(const Ctx& ctx, const float* drows, int64_t d, const int64_t* row, int64_t T,
                      int k, float* dx) {
  TRIDENT_ROUTE(scatter_add_rows, drows, d, row, T, k, dx);
}
void expert_counts(const Ctx& ctx, const int* expert, int64_t n, int E, int64_t* counts) {
  TRIDENT_ROUTE(expert_counts, expert, n, E, counts);
}
void expert_order(const Ctx& ctx, const int* expert, int64_t n, int k, int E, const int64_t* counts,
                  int64_t* row_of, int64_t* send_token) {
  TRIDENT_ROUTE(expert_order, expert, n, k, E, counts, row_of, send_token);
}
void router_frequencies(const Ctx& ctx, const RouterDims& dims, const double* stats, int n_samples,
                        double* f, double* inv_tokens) {
  TRIDENT_ROUTE(router_frequencies, dims, stats, n_samples, f, inv_tokens);
}
void router_capacity(const Ctx& ctx, const RouterDims& dims, int ranks, int me,
                     const int64_t* token, const float* weight, const int* chosen, int64_t capacity,
                     int* expert, int64_t* dropped) {
  TRIDENT_ROUTE(router_capacity, dims, ranks, me, token, weight, chosen, capacity, expert, dropped);
}
void router_scores(const Ctx& ctx, const RouterDims& dims, const float* logits, float* probs,
                   float* lse) {
  TRIDENT_ROUTE(router_scores, dims, logits, probs, lse);
}
void topk_rows(const Ctx& ctx, const float* scores, const float* bias, int64_t T, int E, int k,
               int* idx) {
  TRIDENT_ROUTE(topk_rows, scores, bias, T, E, k, idx);
}
void router_topk(const Ctx& ctx, const RouterDims& dims, const float* probs, const float* bias,
                 int* chosen, float* weight) {
  TRIDENT_ROUTE(router_topk, dims, probs, bias, chosen, weight);
}
void router_load(const Ctx& ctx, const RouterDims& dims, const int* chosen, const int* sample,
                 int n_samples, double* stats) {
  TRIDENT_ROUTE(router_load, dims, chosen, sample, n_samples, stats);
}
void router_losses(const Ctx& ctx, const RouterDims& dims, const float* probs, const float* lse,
                   const RouterLossTerms& terms, double* aux_share, double* z_share) {
  TRIDENT_ROUTE(router_losses, dims, probs, lse, terms, aux_share, z_share);
}
void router_backward(const Ctx& ctx, const RouterDims& dims, const RouterSaved& saved,
                     const RouterLossTerms& terms, const float* dweight, float daux_scale,
                     float* dlogits) {
  TRIDENT_ROUTE(router_backward, dims, saved, terms, dweight, daux_scale, dlogits);
}

}  // namespace trident::kernels
