// Native bf16 on the CPU (kernels/cpu/gemm_bf16.cpp, bf16_rows.cpp): where
// the CPU has AVX512-BF16 (vdpbf16ps: a pair of bf16 products added to an
// fp32 lane), the bf16 GEMMs of the linear layers run on bf16 operands with
// fp32 accumulation; elsewhere, or with TRIDENT_CPU_BF16=staged, every bf16
// op keeps the staged row (widen, f32 kernel, round to nearest even).
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "trident/kernels/attention.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/op_table.hpp"

namespace trident::kernels::cpu {

// What this CPU has for bf16 arithmetic (cpuid, read once).
struct Bf16Units {
  bool avx512 = false;  // AVX-512 F, BW and VL (Skylake-SP, Zen 4+)
  bool avx512_bf16 =
      false;              // vdpbf16ps, vcvtne2ps2bf16, with AVX-512 DQ (Cooper Lake, SPR, Zen 4+)
  bool amx_bf16 = false;  // AMX tiles (Sapphire Rapids+); detected, not used yet
};
Bf16Units bf16_units();

// TRIDENT_CPU_BF16: "staged" (every bf16 op staged, the reference bits),
// "native" (the native GEMMs; an error where the CPU has no AVX512-BF16) or
// "auto" (the default: native where the CPU has it).
enum class Bf16Mode { staged, native, automatic };

// The mode TRIDENT_CPU_BF16 asks for (read once; an unknown value throws
// InputError naming it).
Bf16Mode bf16_mode_from_env();
// Whether the CPU's bf16 rows run their native kernels now. The first call
// resolves TRIDENT_CPU_BF16 (throwing as above, or where "native" is asked
// of a CPU without AVX512-BF16); set_bf16_mode overrides it (tests).
bool bf16_native();
void set_bf16_mode(Bf16Mode mode);
// "native (AVX512-BF16)", "staged (no AVX512-BF16)", "staged (TRIDENT_CPU_BF16=staged)"
std::string bf16_path();

// The CPU's native bf16 rows of the op table (each runs the staged row when
// bf16_native() is false or the call's operands do not fit).
std::span<const OpRow> bf16_rows();

// C = alpha * op(A) op(B) + beta * C on bf16 operands with fp32 accumulation
// (row-major; op(A) M x K, A [M, K] at lda or with ta [K, M]; op(B) K x N, B
// [K, N] at ldb or with tb [N, K]). An operand given as f32 (a_f32, b_f32)
// is rounded to bf16 (nearest even) as it is packed. Needs
// bf16_units().avx512_bf16. C is f32 (beta 0: only written) or, with
// c_bf16, bf16 rounded to nearest even (beta must be 0).
struct Bf16Operand {
  const void* p = nullptr;
  bool f32 = false;    // p holds floats, rounded to bf16 when packed
  bool trans = false;  // stored transposed (see above)
  int64_t ld = 0;
  const uint32_t* packed = nullptr;  // B only: op(B) as pack_bf16_b left it (p not read)
};
void gemm_bf16(int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A, Bf16Operand B,
               float beta, float* C, int64_t ldc);
void gemm_bf16_out(int64_t M, int64_t N, int64_t K, float alpha, Bf16Operand A, Bf16Operand B,
                   uint16_t* C, int64_t ldc);

// Two products of one shape, C_q = alpha * op(A_q) op(B_q) + beta * C_q
// (q = 0, 1; C_0 and C_1 apart), each C the bits of its own gemm_bf16
// call: where A_1 is A_0 (SwiGLU's gate and up from x) each block of op(A)
// is packed once for both, where B_1 is B_0 (their weight gradients, x as
// op(B)) each K block of op(B) (at most one op(B) unpacked: B.packed; else
// two plain calls).
struct Bf16Product {
  Bf16Operand A, B;
  float* C;
};
void gemm_bf16_pair(int64_t M, int64_t N, int64_t K, float alpha, const Bf16Product (&p)[2],
                    float beta, int64_t ldc);

// op(B) (K x N) in the words gemm_bf16 would pack it into, all K blocks in
// turn (bf16_packed_words(N, K) of them): given as B.packed, no call packs it.
int64_t bf16_packed_words(int64_t N, int64_t K);
void pack_bf16_b(int64_t N, int64_t K, Bf16Operand B, uint32_t* dst);
// A weight W [out, in] packed both ways (PackedBf16Weight): as op(B) = Wᵀ
// (nt, y = x Wᵀ) and op(B) = W (nn, dx = dy W); null where not packed.
struct Bf16PackedWeight {
  const uint32_t *nt = nullptr, *nn = nullptr;
};

// y[0:n] = x[0:n] rounded to bf16 (nearest even, as to_bf16: the same bits
// for every input, NaN, infinities and denormals included) and y[0:n] =
// x[0:n] widened to f32 (exact), with the fastest way this CPU has
// (bf16_convert.cpp): vcvtne2ps2bf16 (AVX512-BF16), AVX-512F integer
// arithmetic, or one value at a time. The _with forms take the way (tests);
// one the CPU lacks falls back to the next.
enum class Bf16Convert { scalar, avx512, avx512_bf16 };
Bf16Convert bf16_convert_best();
void round_bf16(const float* x, int64_t n, uint16_t* y);
void widen_bf16(const uint16_t* x, int64_t n, float* y);
void round_bf16_with(Bf16Convert how, const float* x, int64_t n, uint16_t* y);
void widen_bf16_with(Bf16Convert how, const uint16_t* x, int64_t n, float* y);

// A tensor argument of the native kernels: f32 or bf16 data (nullptr:
// absent).
struct F32OrBf16 {
  void* p = nullptr;
  bool f32 = false;
};

// SwiGLU (swiglu.hpp's contract) with its six GEMMs on the native bf16 GEMM:
// x, the weights and the saved gate and up are bf16 or f32 (rounded when
// packed, widened for the gating); the gating is f32, as in the staged row,
// and its h and dh are rounded to bf16 when the next GEMM packs them.
struct SwigluBf16 {
  int64_t T, d, f;
  F32OrBf16 x, w_gate, w_up, w_down;
  Bf16PackedWeight packed[3] = {};  // of w_gate, w_up, w_down
};
void swiglu_forward_bf16(const Ctx& ctx, const SwigluBf16& s, F32OrBf16 y, F32OrBf16 gate,
                         F32OrBf16 up);
void swiglu_backward_bf16(const Ctx& ctx, const SwigluBf16& s, F32OrBf16 gate, F32OrBf16 up,
                          const float* dy, float* dx, float* dw_gate, float* dw_up, float* dw_down);

// Attention (attention.hpp's contract, without resume) with Q·Kᵀ and P·V on
// the native bf16 GEMM (fp32 accumulation; P rounded to bf16 as the GEMM
// packs it) and the online softmax in fp32: q, k and v bf16, out f32 or bf16
// (rounded once at the end), lse f32 (attention_bf16.cpp).
void attention_forward_bf16(const Ctx& ctx, const AttnShape& s, const uint16_t* q,
                            const uint16_t* k, const uint16_t* v, F32OrBf16 out, float* lse);
// Its backward (attention.hpp's contract: the gradients accumulate), with
// the five products on the native GEMM (P and dS rounded to bf16 as it packs
// them) and delta = rowsum(dO O), P and dS in fp32: q, k, v, out and dout
// bf16, lse and the gradients f32.
struct AttnBf16Grad {
  const uint16_t *q, *k, *v, *out, *dout;
  const float* lse;
  float *dq, *dk, *dv;
};
void attention_backward_bf16(const Ctx& ctx, const AttnShape& s, const AttnBf16Grad& a);

}  // namespace trident::kernels::cpu
