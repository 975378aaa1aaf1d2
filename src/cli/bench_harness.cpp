// The benchmarks' shared measurement plumbing (see bench_harness.hpp).
#include "bench_harness.hpp"

#include <algorithm>

namespace trident::cli {

std::vector<double> RankSeries::slowest_per_iteration() const {
  std::vector<double> out(size_t(iters), 0.0);
  for (int r = 0; r < ranks; ++r)
    for (int it = 0; it < iters; ++it) out[size_t(it)] = std::max(out[size_t(it)], at(r, it));
  return out;
}

std::vector<double> RankSeries::median_per_iteration() const {
  std::vector<double> out(static_cast<size_t>(iters));
  for (int it = 0; it < iters; ++it) {
    std::vector<double> col(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) col[size_t(r)] = at(r, it);
    out[size_t(it)] = median(col);
  }
  return out;
}

RankSeries gather_series(Communicator& world, const std::vector<double>& mine) {
  RankSeries s;
  s.ranks = world.size();
  s.iters = int(mine.size());
  s.values.resize(mine.size() * size_t(s.ranks));
  world.allgather(mine.data(), s.values.data(), mine.size() * sizeof(double));
  return s;
}

}  // namespace trident::cli
