// BenchTable: the result of one `trident bench` measurement, printed as an
// aligned table (nccl-tests style: one row per size/case, units in the header)
// and written to HDF5 as /bench/<name>/<column> datasets.
#pragma once
#include <string>
#include <variant>
#include <vector>

namespace trident {

using BenchCell = std::variant<double, long long, std::string>;

struct BenchTable {
  std::string name;                  // HDF5 group name, e.g. "attention"
  std::string title;                 // printed above the table
  std::vector<std::string> columns;  // header, with units: "time_ms", "GFLOP/s"
  std::vector<std::vector<BenchCell>> rows;
  std::vector<std::string> notes;  // printed below (e.g. ratios, machine facts)

  void add_row(std::vector<BenchCell> r) { rows.push_back(std::move(r)); }
  std::string format() const;  // the printed table
};

// Writes the tables into FILE (created or truncated) from the calling
// process only (serial HDF5; call it on rank 0). Root attributes:
// format = "trident-bench", format_version = 2, created_utc, command.
// One dataset per column, named by bench_dataset_name(column); each group
// has attributes title, notes, columns (the headers in order) and rows.
// Integer-only columns are int64, other numeric columns float64, string
// columns variable-length UTF-8. Written to PATH.tmp and renamed when
// complete. An unwritable PATH is an InputError naming --output.
void write_bench_file(const std::string& path, const std::vector<BenchTable>& tables,
                      const std::string& command_line);

// The HDF5 dataset name of a column header: '/' -> "_per_", ' ' -> '_'
// ("algbw_GB/s" -> "algbw_GB_per_s"); the header itself is the dataset's
// attribute `column`.
std::string bench_dataset_name(const std::string& column);

// Statistics the benchmarks share.
double median(std::vector<double> x);  // of a non-empty sample

// Each unit's cost relative to the average unit, from measurements taken side
// by side: t[(u * reps + i) * slots + j] is unit u's time in slot j (a ring
// step, say) of repetition i, where every unit runs slot j of repetition i at
// about the same moment. Per slot and repetition each time is divided by the
// mean over units, so what the units share (the machine's speed at that
// moment) cancels; the median over repetitions of a slot's ratios drops a
// measurement that lost its core; slots are weighted by their median mean
// time, so the result is a share of time. A unit that is x times slower in
// every measurement comes out x times the others, however the machine's
// speed drifted meanwhile. Slots whose mean time is 0 carry no weight.
std::vector<double> paired_relative_cost(const std::vector<double>& t, int units, int reps,
                                         int slots);

}  // namespace trident
