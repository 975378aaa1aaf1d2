// Where the permuted rows of an MoE layer lie when an unpermute reads them,
// as the ep layer's transports hand them over (a buffer they filled, or the
// experts' segments of a shared window). A plain type on host memory, no
// kernel: the transports return it, and the dispatcher turns it into the
// tensors of functional.hpp's combine_rows (kernels/moe.hpp's pointer
// kernels take it as is).
#pragma once
#include <algorithm>
#include <cstdint>

namespace trident::kernels {

// Permuted rows [S, d] as an unpermute reads them: one buffer, or several
// segments (one per expert when the rows stay where the experts wrote
// them, as the shm transport leaves them). Row r lies in the segment s with
// first[s] <= r < first[s + 1], at base[s] + (r - first[s]) * d.
struct RowSource {
  const float* rows = nullptr;         // one buffer (segments == 0)
  const float* const* base = nullptr;  // [segments]
  const int64_t* first = nullptr;      // [segments + 1], ascending
  int segments = 0;

  RowSource() = default;
  RowSource(const float* contiguous) : rows(contiguous) {}  // NOLINT: a buffer is a source
  RowSource(const float* const* b, const int64_t* f, int n) : base(b), first(f), segments(n) {}

  const float* row(int64_t r, int64_t d) const {
    if (segments == 0) return rows + r * d;
    const int s = int(std::upper_bound(first + 1, first + segments + 1, r) - (first + 1));
    return base[s] + (r - first[s]) * d;
  }
};

}  // namespace trident::kernels
