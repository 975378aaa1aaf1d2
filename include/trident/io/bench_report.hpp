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
  std::vector<std::string> notes;    // printed below (e.g. ratios, machine facts)

  void add_row(std::vector<BenchCell> r) { rows.push_back(std::move(r)); }
  std::string format() const;  // the printed table
};

// Writes the tables into FILE (created or truncated) from the calling
// process only (serial HDF5; call it on rank 0). Root attributes:
// format = "trident-bench", format_version = 1, created_utc, command.
void write_bench_file(const std::string& path, const std::vector<BenchTable>& tables,
                      const std::string& command_line);

}  // namespace trident
