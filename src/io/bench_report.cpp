// BenchTable: how `trident bench` shows its results (an aligned text table in
// the manner of nccl-tests) and keeps them (an HDF5 file, one dataset per
// column, so that analysis reads a column as an array).
#include "trident/io/bench_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/io/h5util.hpp"

namespace trident {

namespace {

using h5::Handle;

// Enough digits to read at a glance; small and large magnitudes go to
// exponent form so that no column grows wide.
std::string format_double(double v) {
  char buf[48];
  const double a = std::fabs(v);
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (a == 0)
    std::snprintf(buf, sizeof buf, "0");
  else if (a >= 1e7 || a < 1e-3)
    std::snprintf(buf, sizeof buf, "%.3e", v);
  else if (a >= 1000)
    std::snprintf(buf, sizeof buf, "%.1f", v);
  else if (a >= 1)
    std::snprintf(buf, sizeof buf, "%.3f", v);
  else
    std::snprintf(buf, sizeof buf, "%.5f", v);
  return buf;
}

std::string format_cell(const BenchCell& c) {
  if (const auto* d = std::get_if<double>(&c)) return format_double(*d);
  if (const auto* i = std::get_if<long long>(&c)) return std::to_string(*i);
  return std::get<std::string>(c);
}

enum class ColumnKind { empty, float64, int64, string };

// A column's stored type: integers only -> int64; numbers -> float64;
// strings only -> strings. Mixing strings and numbers is a caller's bug.
ColumnKind column_kind(const BenchTable& t, size_t col) {
  bool any_double = false, any_int = false, any_string = false;
  for (const auto& row : t.rows) {
    any_double |= std::holds_alternative<double>(row[col]);
    any_int |= std::holds_alternative<long long>(row[col]);
    any_string |= std::holds_alternative<std::string>(row[col]);
  }
  TRIDENT_CHECK(
      !(any_string && (any_double || any_int)),
      "bench table '" + t.name + "': column '" + t.columns[col] + "' mixes strings and numbers");
  if (any_string) return ColumnKind::string;
  if (any_double) return ColumnKind::float64;
  if (any_int) return ColumnKind::int64;
  return ColumnKind::empty;
}

void check_shape(const BenchTable& t) {
  TRIDENT_CHECK(!t.name.empty() && t.name.find('/') == std::string::npos && t.name != ".",
                "bench table name '" + t.name + "' must be non-empty without '/'");
  for (size_t r = 0; r < t.rows.size(); ++r)
    TRIDENT_CHECK(t.rows[r].size() == t.columns.size(),
                  "bench table '" + t.name + "': row " + std::to_string(r) + " has " +
                      std::to_string(t.rows[r].size()) + " cells for " +
                      std::to_string(t.columns.size()) + " columns");
}

}  // namespace

std::string bench_dataset_name(const std::string& column) {
  std::string out;
  for (char c : column) {
    if (c == '/')
      out += "_per_";
    else if (c == ' ')
      out += '_';
    else
      out += c;
  }
  if (out.empty() || out == ".") out = "_";
  return out;
}

std::string BenchTable::format() const {
  check_shape(*this);
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) width[c] = columns[c].size();
  for (const auto& row : rows) {
    std::vector<std::string> line;
    for (size_t c = 0; c < row.size(); ++c) {
      line.push_back(format_cell(row[c]));
      width[c] = std::max(width[c], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  // Strings are names (left-aligned); numbers line up on the right.
  std::vector<bool> left(columns.size(), false);
  for (size_t c = 0; c < columns.size(); ++c)
    left[c] = !rows.empty() && std::holds_alternative<std::string>(rows[0][c]);

  std::ostringstream os;
  auto put = [&](size_t c, const std::string& s) {
    os << "  ";
    if (left[c])
      os << s << std::string(width[c] - s.size(), ' ');
    else
      os << std::string(width[c] - s.size(), ' ') << s;
  };
  os << "# " << title << "\n#\n#";
  for (size_t c = 0; c < columns.size(); ++c) put(c, columns[c]);
  os << "\n";
  for (const auto& line : cells) {
    os << " ";
    for (size_t c = 0; c < line.size(); ++c) put(c, line[c]);
    os << "\n";
  }
  if (!notes.empty()) {
    os << "#\n";
    for (const auto& n : notes) os << "# " << n << "\n";
  }
  return os.str();
}

namespace {

// Table names and column dataset names must be unique; every column one kind.
void check_tables(const std::vector<BenchTable>& tables) {
  std::set<std::string> names;
  for (const auto& t : tables) {
    check_shape(t);
    TRIDENT_CHECK(names.insert(t.name).second, "bench table name '" + t.name + "' used twice");
    std::set<std::string> cols;
    for (const auto& c : t.columns)
      TRIDENT_CHECK(cols.insert(bench_dataset_name(c)).second,
                    "bench table '" + t.name + "': column '" + c + "' repeats a column name");
    for (size_t c = 0; c < t.columns.size(); ++c) column_kind(t, c);
  }
}

// Column c of t as the dataset /bench/<table>/<column>: strings, int64 or
// float64 (ints widened to float in a mixed column).
void write_column(hid_t group, const BenchTable& t, size_t c) {
  const std::string dname = bench_dataset_name(t.columns[c]);
  const std::string where = "/bench/" + t.name + "/" + dname;
  hsize_t n[1] = {static_cast<hsize_t>(t.rows.size())};
  Handle space = TRIDENT_H5_SPACE(H5Screate_simple(1, n, nullptr), "column dataspace");
  const ColumnKind kind = column_kind(t, c);
  Handle type;
  hid_t ftype = H5T_IEEE_F64LE;
  if (kind == ColumnKind::int64) ftype = H5T_STD_I64LE;
  if (kind == ColumnKind::string) {
    type = h5::vlen_string_type();
    ftype = type;
  }
  Handle d = TRIDENT_H5_DSET(
      H5Dcreate2(group, dname.c_str(), ftype, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
      "create " + where);
  h5::write_attr(d, "column", t.columns[c]);
  if (t.rows.empty()) return;
  if (kind == ColumnKind::string) {
    std::vector<const char*> p;
    for (const auto& row : t.rows) p.push_back(std::get<std::string>(row[c]).c_str());
    TRIDENT_H5(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.data()), "write " + where);
  } else if (kind == ColumnKind::int64) {
    std::vector<int64_t> v;
    for (const auto& row : t.rows) v.push_back(std::get<long long>(row[c]));
    TRIDENT_H5(H5Dwrite(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()),
               "write " + where);
  } else {
    std::vector<double> v;
    for (const auto& row : t.rows) {
      if (const auto* i = std::get_if<long long>(&row[c]))
        v.push_back(double(*i));
      else
        v.push_back(std::get<double>(row[c]));
    }
    TRIDENT_H5(H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()),
               "write " + where);
  }
}

void write_tables(hid_t file, const std::vector<BenchTable>& tables,
                  const std::string& command_line) {
  h5::write_attr(file, "format", "trident-bench");
  h5::write_attr(file, "format_version", int64_t{2});
  h5::write_attr(file, "created_utc", h5::utc_iso8601_now());
  h5::write_attr(file, "command", command_line);
  h5::write_attr(file, "trident_version", TRIDENT_VERSION);
  Handle bench = h5::open_or_create_group(file, "bench");
  for (const auto& t : tables) {
    Handle g = h5::open_or_create_group(bench, t.name);
    h5::write_attr(g, "title", t.title);
    h5::write_attr(g, "notes", t.notes);
    h5::write_attr(g, "columns", t.columns);
    h5::write_attr(g, "rows", static_cast<int64_t>(t.rows.size()));
    for (size_t c = 0; c < t.columns.size(); ++c) write_column(g, t, c);
  }
}

}  // namespace

void write_bench_file(const std::string& path, const std::vector<BenchTable>& tables,
                      const std::string& command_line) {
  check_tables(tables);
  h5::QuietErrors quiet;
  // Written under a temporary name and renamed when complete, so a failure
  // leaves no half-written file at PATH.
  const std::string tmp = path + ".tmp";
  hid_t f = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0)
    throw InputError("--output " + path + ": cannot create the file (" + h5::error_text() +
                     "); the directory must exist and be writable");
  Handle file(f, H5Fclose);
  try {
    write_tables(file, tables, command_line);
    TRIDENT_H5(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush " + tmp);
    file.reset();
    std::filesystem::rename(tmp, path);
  } catch (...) {
    file.reset();
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
}

double median(std::vector<double> x) {
  TRIDENT_CHECK(!x.empty(), "median of an empty sample");
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

std::vector<double> paired_relative_cost(const std::vector<double>& t, int units, int reps,
                                         int slots) {
  TRIDENT_CHECK(units > 0 && reps > 0 && slots > 0 &&
                    t.size() == size_t(units) * size_t(reps) * size_t(slots),
                "paired_relative_cost: " + std::to_string(t.size()) + " times for " +
                    std::to_string(units) + " units x " + std::to_string(reps) + " reps x " +
                    std::to_string(slots) + " slots");
  auto at = [&](int u, int i, int j) {
    return t[(size_t(u) * size_t(reps) + size_t(i)) * size_t(slots) + size_t(j)];
  };
  std::vector<double> rel(static_cast<size_t>(units), 0.0), ratios(static_cast<size_t>(reps)),
      means(static_cast<size_t>(reps));
  double total_weight = 0;
  for (int j = 0; j < slots; ++j) {
    for (int i = 0; i < reps; ++i) {
      double sum = 0;
      for (int u = 0; u < units; ++u) sum += at(u, i, j);
      means[size_t(i)] = sum / units;
    }
    const double weight = median(means);
    if (!(weight > 0)) continue;
    total_weight += weight;
    for (int u = 0; u < units; ++u) {
      for (int i = 0; i < reps; ++i)
        ratios[size_t(i)] = means[size_t(i)] > 0 ? at(u, i, j) / means[size_t(i)] : 1.0;
      rel[size_t(u)] += weight * median(ratios);
    }
  }
  for (double& x : rel) x = total_weight > 0 ? x / total_weight : 1.0;
  return rel;
}

}  // namespace trident
