// fp64 host references for checking results: the plain definition of an op's
// output, computed on the host in double precision, for the spot checks of
// code that cannot include the kernels themselves (the benches compare rows of
// a device run with it). Host arithmetic over host memory, no kernel: part of
// the public kernels API (scripts/check-layering.py).
#pragma once
#include <cstdint>

#include "trident/kernels/types/attention.hpp"

namespace trident::kernels {

// The plain definition of attention for one query row i and head h,
// accumulated in fp64 over the whole score row (the mask rules of
// types/attention.hpp; the layouts of q [Tq,H,D], k and v [Tk,Hkv,D] as the
// attention ops take them): writes out_row [D], returns the row's LSE (-inf
// when no key is visible). O(Tk * D). Host memory only (q_doc / k_doc
// included).
double attention_reference_row(const AttnShape& s, const float* q, const float* k, const float* v,
                               int64_t i, int h, double* out_row);

}  // namespace trident::kernels
