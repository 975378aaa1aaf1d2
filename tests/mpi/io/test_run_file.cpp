// RunFile on 1, 2 and 4 ranks: every part of the layout is written
// collectively and read back through plain (serial) HDF5 on every rank, with
// memory types defined here by member name, so a renamed or missing member
// fails. Bad arguments must raise the same error on every rank, not hang.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <regex>

#include "io_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/h5util.hpp"
#include "trident/io/run_file.hpp"

using namespace trident;
using namespace trident::testing;

namespace {

// A fresh directory (rank 0 makes it; everyone gets its name).
struct SharedTempDir {
  std::string path;
  SharedTempDir() {
    char buf[256] = {0};
    if (world_rank() == 0) {
      std::string tmpl = (std::filesystem::temp_directory_path() / "trident-io-XXXXXX").string();
      std::snprintf(buf, sizeof buf, "%s", tmpl.c_str());
      if (!mkdtemp(buf)) buf[0] = 0;
    }
    MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
    path = buf;
  }
  ~SharedTempDir() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ec;
    if (world_rank() == 0 && !path.empty()) std::filesystem::remove_all(path, ec);
  }
};

std::string rank0_string(std::string s) {
  int n = static_cast<int>(s.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  s.resize(static_cast<size_t>(n));
  MPI_Bcast(s.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return s;
}

// Expected content, computable on every rank.
StepMetrics expected_step(int i) {
  const uint64_t key = rng::hash_name("io-test-steps");
  auto u = [&](int k) { return 0.5 + rng::uniform(key, static_cast<uint64_t>(i * 16 + k)); };
  StepMetrics m;
  m.step = 10 + i;
  m.loss = 4 * u(0);
  m.aux_loss = 0.1 * u(1);
  m.lr = 1e-3 * u(2);
  m.grad_norm = u(3);
  m.step_time_s = 0.2 * u(4);
  m.tokens_per_s = 1e5 * u(5);
  m.bubble_fraction = 0.3 * u(6);
  return m;
}

std::array<double, 4> expected_comm(int i) {
  const uint64_t key = rng::hash_name("io-test-comm");
  std::array<double, 4> c{};
  for (int k = 0; k < 4; ++k)
    c[k] = 1e6 * (1 + rng::uniform(key, static_cast<uint64_t>(i * 4 + k)));
  return c;
}

std::vector<std::vector<int64_t>> expected_tokens(int i, int layers, int experts) {
  const uint64_t key = rng::hash_name("io-test-tokens");
  std::vector<std::vector<int64_t>> t(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l)
    for (int e = 0; e < experts; ++e)
      t[l].push_back(1 + static_cast<int64_t>(rng::below(
                             key, static_cast<uint64_t>((i * layers + l) * experts + e), 1000)));
  return t;
}

// Events of append call `call` from rank r: call 0 only even ranks have any.
std::vector<TimelineEvent> events_of(int call, int r) {
  static const char* kinds[] = {"F", "B", "W", "SEND_F", "RECV_B", "ATTN"};
  const int n = call == 0 ? (r % 2 == 0 ? r + 1 : 0) : 2;
  const uint64_t key = rng::hash_name("io-test-events");
  std::vector<TimelineEvent> ev;
  for (int i = 0; i < n; ++i) {
    const uint64_t idx = static_cast<uint64_t>((call * 64 + r) * 16 + i);
    TimelineEvent e;
    e.rank = r;
    e.step = 10 + call;
    e.kind = kinds[rng::below(key, idx, 6)];
    e.stage = r;
    e.chunk = i % 2;
    e.microbatch = i;
    e.t_begin_s = 100 + rng::uniform(key, idx + 5000);
    e.t_end_s = e.t_begin_s + 0.01 + rng::uniform(key, idx + 9000);
    ev.push_back(e);
  }
  return ev;
}

RankSummary summary_of(int r) {
  RankSummary s;
  s.rank = r;
  s.peak_rss_bytes = 1e8 * (r + 1) + 12345;
  s.peak_device_bytes = 2e9 + r * 7;
  s.compute_s = 1.5 + r * 0.25;
  for (int k = 0; k < 4; ++k) s.comm_wait_s[k] = r + k * 0.25 + 0.125;
  return s;
}

// Local shard of a [S, seq, rest...] tagged tensor at `positions`.
std::vector<float> shard(int64_t S, const std::vector<int64_t>& positions,
                         const std::vector<int64_t>& rest) {
  std::vector<float> out;
  const int64_t a = rest.size() > 0 ? rest[0] : 1, b = rest.size() > 1 ? rest[1] : 1;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t p : positions)
      for (int64_t h = 0; h < a; ++h)
        for (int64_t d = 0; d < b; ++d) out.push_back(tagged_value(s, p, h, d));
  return out;
}

// Checks a read-back [S, seq, a, b] activation against the tagged values.
void check_activation(hid_t f, const std::string& path, int64_t S, int64_t seq, int64_t a,
                      int64_t b) {
  INFO(path);
  auto dims = dataset_dims(f, path);
  std::vector<hsize_t> want = {hsize_t(S), hsize_t(seq), hsize_t(a)};
  if (b > 1) want.push_back(hsize_t(b));
  REQUIRE(dims == want);
  auto v = read_all<float>(f, path, H5T_NATIVE_FLOAT);
  REQUIRE(v.size() == size_t(S * seq * a * b));
  int64_t wrong = 0;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t p = 0; p < seq; ++p)
      for (int64_t h = 0; h < a; ++h)
        for (int64_t d = 0; d < b; ++d)
          wrong += v[size_t(((s * seq + p) * a + h) * b + d)] != tagged_value(s, p, h, d);
  CHECK(wrong == 0);
  hid_t ds = H5Dopen2(f, path.c_str(), H5P_DEFAULT);
  CHECK(h5::read_int_list_attr(ds, "sample_ids") == std::vector<int64_t>{5, 9});
  H5Dclose(ds);
}

struct StepRowT {  // the reader's own view of /metrics/steps
  int64_t step;
  double loss, aux_loss, lr, grad_norm, step_time_s, tokens_per_s, bubble_fraction;
};
struct RankRowT {
  int64_t rank, node, local_rank, device, pp, dp, cp, ep;
  char hostname[64];
};
struct EventRowT {
  int64_t rank, step;
  char kind[16];
  int64_t stage, chunk, microbatch;
  double t_begin_s, t_end_s;
};
struct SummaryRowT {
  int64_t rank;
  double peak_rss_bytes, peak_device_bytes, compute_s;
  double comm_wait_s[4];
};

hid_t str_type(size_t n) {
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, n);
  H5Tset_strpad(t, H5T_STR_NULLTERM);
  return t;
}

}  // namespace

TEST_CASE("resolve_output_name: %j is the Slurm job id or one local timestamp for all ranks") {
  const char* saved = std::getenv("SLURM_JOB_ID");
  std::string saved_value = saved ? saved : "";
  unsetenv("SLURM_JOB_ID");
  std::string name = resolve_output_name("out-%j.h5", trident::testing::world_comm());
  CHECK(std::regex_match(name, std::regex(R"(out-local-\d{8}-\d{6}\.h5)")));
  CHECK(name == rank0_string(name));

  // Only rank 0's environment counts: the others see another value.
  setenv("SLURM_JOB_ID", world_rank() == 0 ? "4242" : "999", 1);
  CHECK(resolve_output_name("runs/%j/t-%j.h5", trident::testing::world_comm()) ==
        "runs/4242/t-4242.h5");
  CHECK(resolve_output_name("plain.h5", trident::testing::world_comm()) == "plain.h5");
  if (saved)
    setenv("SLURM_JOB_ID", saved_value.c_str(), 1);
  else
    unsetenv("SLURM_JOB_ID");
}

TEST_CASE("RunFile: every part written collectively reads back exactly") {
  const int P = world_size(), me = world_rank();
  SharedTempDir dir;
  REQUIRE(!dir.path.empty());
  const std::string path = dir.path + "/run.h5";
  Config cfg = io_test_config(P);
  auto comms = io_test_comms(cfg);
  const int moe_layers = 2, experts = 4;

  const int64_t S = 2, chunk = 3, seq = 2 * P * chunk, heads = 2, hd = 3;
  {
    RunFile rf(path, trident::testing::world_comm(), cfg, *comms, me == 0 ? "job-7" : "not-rank-0");
    for (int i = 0; i < 3; ++i) {
      if (i < 2) rf.append_events(events_of(i, me));
      if (me == 0) {
        rf.append_step(expected_step(i), expected_comm(i), expected_tokens(i, moe_layers, experts));
      } else {  // only rank 0's values count; the others may pass anything
        StepMetrics junk;
        junk.loss = -1;
        rf.append_step(junk, {-1, -1, -1, -1}, {});
      }
    }
    CHECK(rf.steps_written() == 3);

    // zig-zag shards, listed in order (q) and with halves swapped (k)
    auto pos = zigzag_positions(me, P, chunk, false);
    auto q = shard(S, pos, {heads, hd});
    rf.write_activation(2, 0, "q", {S, seq, heads, hd}, {5, 9}, q.data(), pos);
    auto pos_swapped = zigzag_positions(me, P, chunk, true);
    auto k = shard(S, pos_swapped, {heads, hd});
    rf.write_activation(2, 0, "k", {S, seq, heads, hd}, {5, 9}, k.data(), pos_swapped);
    // one rank holds everything (in reverse order); the others hold nothing
    std::vector<int64_t> all;
    if (me == P - 1)
      for (int64_t p = seq - 1; p >= 0; --p) all.push_back(p);
    auto logits = shard(S, all, {experts});
    rf.write_activation(2, 1, "router_logits", {S, seq, experts}, {5, 9},
                        logits.empty() ? nullptr : logits.data(), all);

    rf.write_rank_summaries(summary_of(me));
    rf.set_root_attr("note", me == 0 ? "from rank 0" : "from another rank");
    rf.close();
  }

  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);

  {  // root attributes
    CHECK(h5::read_string_attr(f, "format") == "trident-run");
    CHECK(h5::read_int_attr(f, "format_version") == 3);
    CHECK(h5::read_string_attr(f, "trident_version") == TRIDENT_VERSION);
    const std::string toml = h5::read_string_attr(f, "config_toml");
    CHECK(toml == to_toml(cfg));
    CHECK(to_toml(parse_config_text(toml, "run.h5")) == toml);
    CHECK(std::regex_match(h5::read_string_attr(f, "created_utc"),
                           std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
    CHECK(h5::read_int_attr(f, "world_size") == P);
    CHECK(h5::read_string_attr(f, "slurm_job_id") == "job-7");
    CHECK(h5::read_int_attr(f, "completed") == 1);
    CHECK(h5::read_string_attr(f, "note") == "from rank 0");
  }

  {  // topology
    hid_t g = H5Gopen2(f, "topology", H5P_DEFAULT);
    REQUIRE(g >= 0);
    CHECK(h5::read_int_attr(g, "nodes") == 1);
    CHECK(h5::read_int_attr(g, "ranks_per_node") == P);
    CHECK(h5::read_int_attr(g, "nvlink_domain") == P);
    CHECK(h5::read_string_attr(g, "source") == "override");
    CHECK(h5::read_int_attr(g, "pp") == 1);
    CHECK(h5::read_int_attr(g, "dp") == 1);
    CHECK(h5::read_int_attr(g, "cp") == P);
    CHECK(h5::read_int_attr(g, "ep") == 1);
    CHECK(h5::read_int_attr(g, "vpp") == 1);
    H5Gclose(g);

    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(RankRowT));
    H5Tinsert(t, "rank", HOFFSET(RankRowT, rank), H5T_NATIVE_INT64);
    H5Tinsert(t, "node", HOFFSET(RankRowT, node), H5T_NATIVE_INT64);
    H5Tinsert(t, "local_rank", HOFFSET(RankRowT, local_rank), H5T_NATIVE_INT64);
    H5Tinsert(t, "device", HOFFSET(RankRowT, device), H5T_NATIVE_INT64);
    H5Tinsert(t, "pp", HOFFSET(RankRowT, pp), H5T_NATIVE_INT64);
    H5Tinsert(t, "dp", HOFFSET(RankRowT, dp), H5T_NATIVE_INT64);
    H5Tinsert(t, "cp", HOFFSET(RankRowT, cp), H5T_NATIVE_INT64);
    H5Tinsert(t, "ep", HOFFSET(RankRowT, ep), H5T_NATIVE_INT64);
    hid_t s64 = str_type(64);
    H5Tinsert(t, "hostname", HOFFSET(RankRowT, hostname), s64);
    auto rows = read_all<RankRowT>(f, "topology/ranks", t);
    H5Tclose(s64);
    H5Tclose(t);
    REQUIRE(rows.size() == size_t(P));
    std::vector<int> cp_seen(static_cast<size_t>(P), 0);
    for (int r = 0; r < P; ++r) {
      const RankInfo& info = comms->topo.ranks[static_cast<size_t>(r)];
      RankCoord c = comms->mesh.coord(info.logical);
      INFO("row " << r);
      CHECK(rows[r].rank == r);
      CHECK(rows[r].node == info.node);
      CHECK(rows[r].local_rank == info.local_rank);
      CHECK(rows[r].device == info.device);
      CHECK(rows[r].pp == c.pp);
      CHECK(rows[r].dp == c.dp);
      CHECK(rows[r].cp == c.cp);
      CHECK(rows[r].ep == c.ep);
      CHECK(std::string(rows[r].hostname) == info.hostname.substr(0, 63));
      CHECK(!std::string(rows[r].hostname).empty());
      if (rows[r].cp >= 0 && rows[r].cp < P) cp_seen[size_t(rows[r].cp)]++;
    }
    CHECK(std::count(cp_seen.begin(), cp_seen.end(), 1) == P);  // cp = world: all distinct
  }

  {  // metrics
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(StepRowT));
    H5Tinsert(t, "step", HOFFSET(StepRowT, step), H5T_NATIVE_INT64);
    H5Tinsert(t, "loss", HOFFSET(StepRowT, loss), H5T_NATIVE_DOUBLE);
    H5Tinsert(t, "aux_loss", HOFFSET(StepRowT, aux_loss), H5T_NATIVE_DOUBLE);
    H5Tinsert(t, "lr", HOFFSET(StepRowT, lr), H5T_NATIVE_DOUBLE);
    H5Tinsert(t, "grad_norm", HOFFSET(StepRowT, grad_norm), H5T_NATIVE_DOUBLE);
    H5Tinsert(t, "step_time_s", HOFFSET(StepRowT, step_time_s), H5T_NATIVE_DOUBLE);
    H5Tinsert(t, "tokens_per_s", HOFFSET(StepRowT, tokens_per_s), H5T_NATIVE_DOUBLE);
    H5Tinsert(t, "bubble_fraction", HOFFSET(StepRowT, bubble_fraction), H5T_NATIVE_DOUBLE);
    auto rows = read_all<StepRowT>(f, "metrics/steps", t);
    H5Tclose(t);
    REQUIRE(rows.size() == 3);
    for (int i = 0; i < 3; ++i) {
      StepMetrics e = expected_step(i);
      INFO("step row " << i);
      CHECK(rows[i].step == e.step);
      CHECK(rows[i].loss == e.loss);
      CHECK(rows[i].aux_loss == e.aux_loss);
      CHECK(rows[i].lr == e.lr);
      CHECK(rows[i].grad_norm == e.grad_norm);
      CHECK(rows[i].step_time_s == e.step_time_s);
      CHECK(rows[i].tokens_per_s == e.tokens_per_s);
      CHECK(rows[i].bubble_fraction == e.bubble_fraction);
    }

    CHECK(dataset_dims(f, "metrics/comm_bytes") == std::vector<hsize_t>{3, 4});
    auto cb = read_all<double>(f, "metrics/comm_bytes", H5T_NATIVE_DOUBLE);
    REQUIRE(cb.size() == 12);
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < 4; ++k) CHECK(cb[size_t(i * 4 + k)] == expected_comm(i)[k]);
    hid_t d = H5Dopen2(f, "metrics/comm_bytes", H5P_DEFAULT);
    CHECK(h5::read_string_list_attr(d, "columns") ==
          std::vector<std::string>{"cp", "pp", "ep", "dp"});
    H5Dclose(d);

    CHECK(dataset_dims(f, "metrics/expert_tokens") ==
          std::vector<hsize_t>{3, hsize_t(moe_layers), hsize_t(experts)});
    auto et = read_all<int64_t>(f, "metrics/expert_tokens", H5T_NATIVE_INT64);
    REQUIRE(et.size() == size_t(3 * moe_layers * experts));
    for (int i = 0; i < 3; ++i) {
      auto want = expected_tokens(i, moe_layers, experts);
      for (int l = 0; l < moe_layers; ++l)
        for (int e = 0; e < experts; ++e)
          CHECK(et[size_t((i * moe_layers + l) * experts + e)] == want[l][e]);
    }
    d = H5Dopen2(f, "metrics/expert_tokens", H5P_DEFAULT);
    CHECK(h5::read_int_list_attr(d, "moe_layer_ids") == std::vector<int64_t>{1, 3});
    H5Dclose(d);
  }

  {  // timeline
    std::vector<TimelineEvent> want;
    for (int call = 0; call < 2; ++call)
      for (int r = 0; r < P; ++r) {
        auto e = events_of(call, r);
        want.insert(want.end(), e.begin(), e.end());
      }
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(EventRowT));
    H5Tinsert(t, "rank", HOFFSET(EventRowT, rank), H5T_NATIVE_INT64);
    H5Tinsert(t, "step", HOFFSET(EventRowT, step), H5T_NATIVE_INT64);
    hid_t s16 = str_type(16);
    H5Tinsert(t, "kind", HOFFSET(EventRowT, kind), s16);
    H5Tinsert(t, "stage", HOFFSET(EventRowT, stage), H5T_NATIVE_INT64);
    H5Tinsert(t, "chunk", HOFFSET(EventRowT, chunk), H5T_NATIVE_INT64);
    H5Tinsert(t, "microbatch", HOFFSET(EventRowT, microbatch), H5T_NATIVE_INT64);
    H5Tinsert(t, "t_begin_s", HOFFSET(EventRowT, t_begin_s), H5T_NATIVE_DOUBLE);
    H5Tinsert(t, "t_end_s", HOFFSET(EventRowT, t_end_s), H5T_NATIVE_DOUBLE);
    auto rows = read_all<EventRowT>(f, "timeline/events", t);
    H5Tclose(s16);
    H5Tclose(t);
    REQUIRE(rows.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("event " << i);
      CHECK(rows[i].rank == want[i].rank);
      CHECK(rows[i].step == want[i].step);
      CHECK(std::string(rows[i].kind) == want[i].kind);
      CHECK(rows[i].stage == want[i].stage);
      CHECK(rows[i].chunk == want[i].chunk);
      CHECK(rows[i].microbatch == want[i].microbatch);
      CHECK(rows[i].t_begin_s == want[i].t_begin_s);
      CHECK(rows[i].t_end_s == want[i].t_end_s);
    }
  }

  {  // activations
    check_activation(f, "activations/step_2/layer_0/q", S, seq, heads, hd);
    check_activation(f, "activations/step_2/layer_0/k", S, seq, heads, hd);
    check_activation(f, "activations/step_2/layer_1/router_logits", S, seq, experts, 1);
  }

  {  // rank summary
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof(SummaryRowT));
    H5Tinsert(t, "rank", HOFFSET(SummaryRowT, rank), H5T_NATIVE_INT64);
    H5Tinsert(t, "peak_rss_bytes", HOFFSET(SummaryRowT, peak_rss_bytes), H5T_NATIVE_DOUBLE);
    H5Tinsert(t, "peak_device_bytes", HOFFSET(SummaryRowT, peak_device_bytes), H5T_NATIVE_DOUBLE);
    H5Tinsert(t, "compute_s", HOFFSET(SummaryRowT, compute_s), H5T_NATIVE_DOUBLE);
    hsize_t four[1] = {4};
    hid_t arr = H5Tarray_create2(H5T_NATIVE_DOUBLE, 1, four);
    H5Tinsert(t, "comm_wait_s", HOFFSET(SummaryRowT, comm_wait_s), arr);
    auto rows = read_all<SummaryRowT>(f, "ranks/summary", t);
    H5Tclose(arr);
    H5Tclose(t);
    REQUIRE(rows.size() == size_t(P));
    for (int r = 0; r < P; ++r) {
      RankSummary w = summary_of(r);
      INFO("summary row " << r);
      CHECK(rows[r].rank == r);
      CHECK(rows[r].peak_rss_bytes == w.peak_rss_bytes);
      CHECK(rows[r].peak_device_bytes == w.peak_device_bytes);
      CHECK(rows[r].compute_s == w.compute_s);
      for (int k = 0; k < 4; ++k) CHECK(rows[r].comm_wait_s[k] == w.comm_wait_s[k]);
    }
  }
  H5Fclose(f);
}

TEST_CASE("RunFile: bad arguments fail on every rank, and the file stays usable") {
  const int P = world_size(), me = world_rank();
  SharedTempDir dir;
  REQUIRE(!dir.path.empty());
  const std::string path = dir.path + "/bad.h5";
  Config cfg = io_test_config(P);
  auto comms = io_test_comms(cfg);
  const int64_t S = 1, seq = 2 * P;
  {
    RunFile rf(path, trident::testing::world_comm(), cfg, *comms, "");
    // Rank 0's expert_tokens have the wrong shape: every rank throws.
    CHECK_THROWS_AS(rf.append_step(StepMetrics{}, {1, 2, 3, 4}, {{1, 2}}), Error);
    // One rank's event kind is too long.
    std::vector<TimelineEvent> ev(1);
    ev[0].kind = me == P - 1 ? "A_KIND_FAR_TOO_LONG" : "F";
    CHECK_THROWS_AS(rf.append_events(ev), Error);
    // Ranks disagree on the shape: nobody may create the dataset.
    auto pos = zigzag_positions(me, P, 1, false);
    auto data = shard(S, pos, {});
    if (P > 1) {  // with one rank there is nobody to disagree with
      int64_t my_seq = me == 0 ? seq + 2 : seq;
      CHECK_THROWS_AS(rf.write_activation(0, 0, "q", {S, my_seq}, {0}, data.data(), pos), Error);
    }
    // One rank gives a position outside the sequence.
    auto bad_pos = pos;
    if (me == P - 1) bad_pos.back() = seq;
    CHECK_THROWS_AS(rf.write_activation(0, 0, "q", {S, seq}, {0}, data.data(), bad_pos), Error);
    // A correct write then succeeds, and a second one of the same name fails.
    rf.write_activation(0, 0, "q", {S, seq}, {0}, data.data(), pos);
    CHECK_THROWS_AS(rf.write_activation(0, 0, "q", {S, seq}, {0}, data.data(), pos), Error);
    rf.append_step(expected_step(0), expected_comm(0), expected_tokens(0, 2, 4));
    rf.close();
  }
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  CHECK(h5::read_int_attr(f, "completed") == 1);
  CHECK(dataset_dims(f, "metrics/steps") == std::vector<hsize_t>{1});
  CHECK(dataset_dims(f, "timeline/events") == std::vector<hsize_t>{0});
  auto q = read_all<float>(f, "activations/step_0/layer_0/q", H5T_NATIVE_FLOAT);
  REQUIRE(q.size() == size_t(seq));
  for (int64_t p = 0; p < seq; ++p) CHECK(q[size_t(p)] == tagged_value(0, p, 0, 0));
  H5Fclose(f);
}

TEST_CASE("RunFile: an output path that cannot be created is an InputError on every rank") {
  const int P = world_size();
  SharedTempDir dir;
  Config cfg = io_test_config(P);
  auto comms = io_test_comms(cfg);
  const std::string path = dir.path + "/no-such-dir/run.h5";
  try {
    RunFile rf(path, trident::testing::world_comm(), cfg, *comms, "");
    FAIL("no exception");
  } catch (const InputError& e) {
    CHECK_THAT(e.what(), Catch::Contains(path));
  }
  CHECK(!std::filesystem::exists(path));
}
