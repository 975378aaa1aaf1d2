// What the benchmarks share: every rank's per-iteration measurements gathered
// to every rank, reduced per iteration (slowest or median rank) before the
// median over iterations; and a table's fixed parts as data.
#pragma once
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/io/bench_report.hpp"

namespace trident::cli {

// values[r * iters + it]: rank r's measurement in iteration it.
struct RankSeries {
  int ranks = 0, iters = 0;
  std::vector<double> values;

  double at(int r, int it) const { return values[size_t(r) * size_t(iters) + size_t(it)]; }
  std::vector<double> slowest_per_iteration() const;  // max over ranks
  std::vector<double> median_per_iteration() const;   // median over ranks
};

// Collective over world: every rank passes its iterations (the same count).
RankSeries gather_series(Communicator& world, const std::vector<double>& mine);

// A table's name, title, columns and notes; rows are added to make()'s result.
struct TableSpec {
  std::string name, title;
  std::vector<std::string> columns, notes;
  BenchTable make() const { return BenchTable{name, title, columns, {}, notes}; }
};

}  // namespace trident::cli
