// BenchTable: the printed table lines up, and the bench file holds every
// column with its type, read back through plain HDF5.
#include <hdf5.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/io/h5util.hpp"

using namespace trident;

namespace {

BenchTable sample_table() {
  BenchTable t;
  t.name = "ring";
  t.title = "ring attention, 4 ranks";
  t.columns = {"seq", "layout", "time_ms", "GFLOP/s", "#wrong"};
  t.add_row({1024LL, std::string("zigzag"), 1.25, 3456.5, 0LL});
  t.add_row({65536LL, std::string("contiguous"), 812.0625, 12.5, 0LL});
  t.add_row({8LL, std::string("zz"), 0.0001234, 1.0e9, 3LL});
  t.notes = {"zigzag/contiguous at 65536: 1.8x"};
  return t;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream is(s);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

std::string temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "trident-bench-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  REQUIRE(mkdtemp(buf.data()) != nullptr);
  return buf.data();
}

template <class T>
std::vector<T> read_column(hid_t g, const std::string& name, hid_t mem, H5T_class_t want_class) {
  hid_t d = H5Dopen2(g, name.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  hid_t ft = H5Dget_type(d);
  CHECK(H5Tget_class(ft) == want_class);
  H5Tclose(ft);
  hid_t sp = H5Dget_space(d);
  std::vector<T> v(static_cast<size_t>(H5Sget_simple_extent_npoints(sp)));
  if (!v.empty()) REQUIRE(H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0);
  H5Sclose(sp);
  H5Dclose(d);
  return v;
}

}  // namespace

TEST_CASE("BenchTable::format: title, aligned header and rows, notes") {
  BenchTable t = sample_table();
  auto lines = lines_of(t.format());
  REQUIRE(lines.size() == 1 + 1 + 1 + 3 + 1 + 1);
  CHECK(lines[0] == "# ring attention, 4 ranks");
  const std::string& header = lines[2];
  CHECK(header[0] == '#');
  for (const auto& c : t.columns) CHECK(header.find(c) != std::string::npos);
  // Every row is as wide as the header, and each numeric column ends where
  // its header ends (right-aligned); the string column starts where its
  // header starts (left-aligned).
  for (int r = 3; r < 6; ++r) {
    INFO(lines[r]);
    CHECK(lines[r].size() == header.size());
    CHECK(lines[r][0] == ' ');
  }
  const size_t seq_end = header.find("seq") + 3;
  CHECK(lines[3].substr(0, seq_end).ends_with("1024"));
  CHECK(lines[4].substr(0, seq_end).ends_with("65536"));
  const size_t layout_at = header.find("layout");
  CHECK(lines[4].substr(layout_at).starts_with("contiguous"));
  CHECK(lines[5].substr(layout_at).starts_with("zz "));
  const size_t time_end = header.find("time_ms") + 7;
  CHECK(lines[3].substr(0, time_end).ends_with(" 1.250"));
  CHECK(lines[4].substr(0, time_end).ends_with(" 812.062"));
  CHECK(lines[5].substr(0, time_end).ends_with(" 1.234e-04"));
  const size_t wrong_end = header.find("#wrong") + 6;
  CHECK(lines[5].substr(0, wrong_end).ends_with(" 3"));
  CHECK(lines[6] == "#");
  CHECK(lines[7] == "# zigzag/contiguous at 65536: 1.8x");
}

TEST_CASE("BenchTable::format refuses a row with the wrong number of cells") {
  BenchTable t = sample_table();
  t.add_row({1LL, std::string("x")});
  CHECK_THROWS_AS(t.format(), Error);
}

TEST_CASE("bench_dataset_name: headers become HDF5 names") {
  CHECK(bench_dataset_name("GFLOP/s") == "GFLOP_per_s");
  CHECK(bench_dataset_name("algbw GB/s") == "algbw_GB_per_s");
  CHECK(bench_dataset_name("time_ms") == "time_ms");
}

TEST_CASE("write_bench_file: one dataset per column, typed, with the table's attributes") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/bench.h5";
  BenchTable t = sample_table();
  BenchTable empty;
  empty.name = "empty";
  empty.title = "nothing measured";
  empty.columns = {"size_B", "time_us"};
  write_bench_file(path, {t, empty}, "trident bench ring --seq 1024");
  CHECK(!std::filesystem::exists(path + ".tmp"));

  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  CHECK(h5::read_string_attr(f, "format") == "trident-bench");
  CHECK(h5::read_int_attr(f, "format_version") == 2);
  CHECK(h5::read_string_attr(f, "command") == "trident bench ring --seq 1024");
  CHECK(h5::read_string_attr(f, "created_utc").size() == 20);

  hid_t g = H5Gopen2(f, "bench/ring", H5P_DEFAULT);
  REQUIRE(g >= 0);
  CHECK(h5::read_string_attr(g, "title") == t.title);
  CHECK(h5::read_string_list_attr(g, "notes") == t.notes);
  CHECK(h5::read_string_list_attr(g, "columns") == t.columns);
  auto seq = read_column<int64_t>(g, "seq", H5T_NATIVE_INT64, H5T_INTEGER);
  CHECK(seq == std::vector<int64_t>{1024, 65536, 8});
  auto time = read_column<double>(g, "time_ms", H5T_NATIVE_DOUBLE, H5T_FLOAT);
  CHECK(time == std::vector<double>{1.25, 812.0625, 0.0001234});
  auto gf = read_column<double>(g, "GFLOP_per_s", H5T_NATIVE_DOUBLE, H5T_FLOAT);
  CHECK(gf == std::vector<double>{3456.5, 12.5, 1.0e9});
  auto wrong = read_column<int64_t>(g, "#wrong", H5T_NATIVE_INT64, H5T_INTEGER);
  CHECK(wrong == std::vector<int64_t>{0, 0, 3});
  hid_t d = H5Dopen2(g, "GFLOP_per_s", H5P_DEFAULT);
  CHECK(h5::read_string_attr(d, "column") == "GFLOP/s");
  H5Dclose(d);
  hid_t vs = H5Tcopy(H5T_C_S1);
  H5Tset_size(vs, H5T_VARIABLE);
  auto layout = read_column<char*>(g, "layout", vs, H5T_STRING);
  REQUIRE(layout.size() == 3);
  CHECK(std::string(layout[0]) == "zigzag");
  CHECK(std::string(layout[1]) == "contiguous");
  CHECK(std::string(layout[2]) == "zz");
  for (char* p : layout) H5free_memory(p);
  H5Tclose(vs);
  H5Gclose(g);

  g = H5Gopen2(f, "bench/empty", H5P_DEFAULT);
  REQUIRE(g >= 0);
  CHECK(h5::read_int_attr(g, "rows") == 0);
  CHECK(read_column<double>(g, "size_B", H5T_NATIVE_DOUBLE, H5T_FLOAT).empty());
  H5Gclose(g);
  H5Fclose(f);
  std::filesystem::remove_all(dir);
}

TEST_CASE("write_bench_file: bad tables and paths leave no file behind") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/bench.h5";
  BenchTable mixed = sample_table();
  mixed.rows[1][1] = 7LL;  // a number in the string column
  CHECK_THROWS_AS(write_bench_file(path, {mixed}, "x"), Error);
  BenchTable t = sample_table();
  CHECK_THROWS_AS(write_bench_file(path, {t, t}, "x"), Error);  // name used twice
  CHECK(!std::filesystem::exists(path));
  CHECK(!std::filesystem::exists(path + ".tmp"));

  const std::string missing = dir + "/no-such-dir/bench.h5";
  try {
    write_bench_file(missing, {t}, "x");
    FAIL("no exception");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains("--output") && Catch::Contains(missing));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("median: odd and even samples, empty refused") {
  CHECK(median({3.0, 1.0, 2.0}) == 2.0);
  CHECK(median({4.0, 1.0, 3.0, 2.0}) == 2.5);
  CHECK_THROWS_AS(median({}), Error);
}

TEST_CASE("paired_relative_cost: a unit's own slowness survives, the machine's drift cancels") {
  // Unit u is bias[u] times slower in every slot; repetition i ran while the
  // machine's speed was drift[i] (a 2x swing); slot j costs base[j].
  const int units = 4, reps = 9, slots = 5;
  const std::vector<double> bias = {1.0, 1.04, 0.97, 1.10};
  const std::vector<double> drift = {1.0, 1.9, 0.7, 1.3, 1.05, 0.8, 2.0, 1.1, 0.95};
  const std::vector<double> base = {3.0, 1.0, 1.0, 0.5, 2.25};
  std::vector<double> t(size_t(units) * reps * slots);
  auto at = [&](int u, int i, int j) -> double& { return t[(size_t(u) * reps + i) * slots + j]; };
  for (int u = 0; u < units; ++u)
    for (int i = 0; i < reps; ++i)
      for (int j = 0; j < slots; ++j)
        at(u, i, j) = bias[size_t(u)] * drift[size_t(i)] * base[size_t(j)];
  auto rel = paired_relative_cost(t, units, reps, slots);
  for (int u = 1; u < units; ++u)
    CHECK(rel[size_t(u)] / rel[0] == Approx(bias[size_t(u)]).epsilon(1e-12));

  // One measurement 3x too slow (a span that lost its core) moves nothing.
  at(1, 4, 2) *= 3.0;
  rel = paired_relative_cost(t, units, reps, slots);
  CHECK(rel[1] / rel[0] == Approx(bias[1]).epsilon(1e-12));

  // A slot where nobody computes (all zero) carries no weight.
  for (int u = 0; u < units; ++u)
    for (int i = 0; i < reps; ++i) at(u, i, 3) = 0.0;
  rel = paired_relative_cost(t, units, reps, slots);
  CHECK(rel[3] / rel[0] == Approx(bias[3]).epsilon(1e-12));

  // Slots weigh by their cost: a unit slow in the dearest slot only is
  // slower overall than one equally slow in the cheapest slot only.
  std::vector<double> s(size_t(2) * 3 * 2, 1.0);  // 2 units, 3 reps, slots costing 1 and 4
  for (int i = 0; i < 3; ++i) s[size_t(i) * 2 + 1] = 4.0, s[size_t(3 + i) * 2 + 1] = 4.0;
  for (int i = 0; i < 3; ++i) s[size_t(3 + i) * 2 + 1] *= 1.2;  // unit 1: 20% slower in slot 1
  rel = paired_relative_cost(s, 2, 3, 2);
  // Ratios in slot 1: 1/1.1 and 1.2/1.1; weight 4.4 of 5.4.
  CHECK(rel[1] / rel[0] == Approx((1.0 + 4.4 * 1.2 / 1.1) / (1.0 + 4.4 / 1.1)).epsilon(1e-12));

  CHECK_THROWS_AS(paired_relative_cost(t, units, reps, slots + 1), Error);
}
