// A GEMM that reads its operands where they lie, for the attention tiles.
//
// OpenBLAS copies both operands of every call into its own panel layout
// before computing. For the attention's tiles (a few hundred rows, K or N
// of 32 to 512) that copy is a large share of the call: the same K and V
// rows are copied again for every query block, and P is copied once more
// after the softmax wrote it. gemm_direct needs only that B's rows are
// contiguous along N (so that its register tile loads them as vectors); A
// is read element by element, by rows or transposed, where it lies. The
// attention transposes K and V once per head and call so that Q·Kᵀ and
// dO·Vᵀ take this form; every other attention GEMM has it already.
//
// On an x86-64 machine with AVX-512F and FMA (checked when the program
// runs) a register-blocked kernel computes 8 x 32 blocks of C, each
// element's sum one fused multiply-add chain in the order of k; elsewhere
// the call goes to sgemm (OpenBLAS) with the same arguments.
#pragma once
#include <cstdint>

#include "trident/kernels/context.hpp"

namespace trident::kernels::cpu {

// C = alpha * op(A) * B + beta * C, row-major float32 (beta 0: C is only
// written).
// op(A) is M x K: A is [M, K] at row stride lda, or with a_trans [K, M]
// (read transposed); B is [K, N] at row stride ldb; C is [M, N] at ldc.
void gemm_direct(const Ctx& ctx, bool a_trans, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc);

// C = alpha * A Wᵀ + beta * C with W [N, K] at row stride ldw (a linear
// layer's forward, weights [out, in]); A by rows, M x K at lda. Native (and
// K <= 1024): each block of 32 rows of W is transposed into a panel just
// before the row tiles read it, which equals gemm_direct with B = Wᵀ bit
// for bit; elsewhere sgemm.
void gemm_direct_nt(const Ctx& ctx, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    int64_t lda, const float* W, int64_t ldw, float beta, float* C, int64_t ldc);

// B held in panels of kPanel columns, for the gemm_direct_* calls below:
// element (k, n) of the [K, N] operand at p[(c / kPanel) * stride + k *
// kPanel + c % kPanel], c = col0 + n. The K rows of one column block are
// then one contiguous run, read in order. From a row-major B whose rows lie
// kilobytes apart (the attention's Kᵀ: 16 KiB at seq 4096) the same tiles
// ran at 80-105 GFLOP/s from one process to the next, depending on where
// the rows' pages fell in the caches; from panels at 105 every time.
inline constexpr int64_t kPanel = 32;
struct PanelB {
  const float* p;  // at row k = 0
  int64_t stride;  // floats from one panel to the next (>= K * kPanel)
  int64_t col0;    // the column of the grid that is column 0 of the call
};

// xp in panels of x's transpose: element (c, r) of xᵀ (= x[r * ld + c]) at
// xp[(r / kPanel) * stride + c * kPanel + r % kPanel], for r < rows, c <
// cols; the rest of the last panel is not written. Native only.
void transpose_panels(const float* x, int64_t ld, int64_t rows, int64_t cols, float* xp,
                      int64_t stride);

// xp in panels of x itself: element (r, c) = x[r * ld + c] at xp[(c / kPanel)
// * stride + r * kPanel + c % kPanel], for r < rows, c < cols; the rest of
// the last panel is not written. On every machine.
void pack_panels(const float* x, int64_t ld, int64_t rows, int64_t cols, float* xp, int64_t stride);

// gemm_direct with B in panels (A by rows, or with a_trans transposed).
// Native only.
void gemm_direct_panels(bool a_trans, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                        int64_t lda, PanelB B, float beta, float* C, int64_t ldc);

// What gemm_direct_rows does with each element x = alpha * (op(A) B)[i][j]
// of C before storing it (the attention's per-row passes over a tile, done
// while the tile is in registers). row[i] is a value per row of C; P is
// [M, N] at row stride ldp. Each is the operation the attention's own pass
// would perform on the stored x, with the same roundings.
enum class RowOp {
  kExp,   // C = exp(x - row[i]), the exp of attention's softmax (about one ulp)
  kGrad,  // C = P * (x - row[i])
};

// C = op(x) for the M x N block, A by rows (not transposed), B in panels,
// beta 0. Only where gemm_direct_native(): the caller keeps its own passes
// elsewhere.
void gemm_direct_rows(RowOp op, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                      int64_t lda, PanelB B, float* C, int64_t ldc, const float* row,
                      const float* P, int64_t ldp);

// The forward softmax's row passes in AVX-512 (only where
// gemm_direct_native()): the largest of x[0:n] (NaN ignored; -inf for n =
// 0), as attention.cpp's own pass finds it, and x[j] <- exp(x[j] - m) with
// its exponentials, returning the sum of the x[j] added in two 16-lane
// chains (attention.cpp's pass adds in eight lanes: the sums differ in their
// last bits).
float row_max_native(const float* x, int64_t n);
float exp_shift_sum_native(float* x, int64_t n, float m);

// Whether gemm_direct runs its own kernel on this machine (else sgemm).
bool gemm_direct_native();

// xt[c * ldt + r] = x[r * ld + c] for r < rows, c < cols: the operand that
// gemm_direct needs by rows, written once where a caller holds it by columns
// (AVX-512 blocks of 16 x 16 where gemm_direct is native, a loop elsewhere).
void transpose_rows(const float* x, int64_t ld, int64_t rows, int64_t cols, float* xt, int64_t ldt);

}  // namespace trident::kernels::cpu
