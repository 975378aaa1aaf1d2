// The attention tests' shapes and inputs, shared by test_gpu_attention.cpp
// and the CPU test of its bf16 bounds (test_bf16_bounds.cpp), which must see
// the very data the GPU test compares.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "harness.hpp"
#include "trident/kernels/attention.hpp"

namespace gpu_test {

using trident::kernels::AttnShape;

inline AttnShape shape(int64_t Tq, int64_t Tk, int H, int Hkv, int D, bool causal,
                       int64_t q_pos0 = 0, int64_t k_pos0 = 0) {
  AttnShape s;
  s.Tq = Tq;
  s.Tk = Tk;
  s.H = H;
  s.Hkv = Hkv;
  s.D = D;
  s.scale = 1.0f / std::sqrt(float(D));
  s.causal = causal;
  s.q_pos0 = q_pos0;
  s.k_pos0 = k_pos0;
  return s;
}

inline std::string name_of(const AttnShape& s) {
  return "Tq " + std::to_string(s.Tq) + " Tk " + std::to_string(s.Tk) + " H " +
         std::to_string(s.H) + "/" + std::to_string(s.Hkv) + " D " + std::to_string(s.D) +
         (s.causal ? " causal" : " full") + " q0 " + std::to_string(s.q_pos0) + " k0 " +
         std::to_string(s.k_pos0);
}

struct Inputs {
  std::vector<float> q, k, v, dout, dq0, dk0, dv0;
};

inline Inputs inputs(const AttnShape& s, bool bf16) {
  const size_t nq = static_cast<size_t>(s.Tq * s.H * s.D),
               nk = static_cast<size_t>(s.Tk * s.Hkv * s.D);
  Inputs in{randn(nq, "q"),   randn(nk, "k"),   randn(nk, "v"),  randn(nq, "dout"),
            randn(nq, "dq0"), randn(nk, "dk0"), randn(nk, "dv0")};
  if (bf16)
    for (auto* x : {&in.q, &in.k, &in.v, &in.dout}) *x = round_bf16(*x);
  return in;
}

}  // namespace gpu_test
