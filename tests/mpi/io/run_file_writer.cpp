// A tiny run-file writer for the h5py/h5dump checks (check_run_file.py
// recomputes every value from the same formulas):
//   run_file_writer OUT.h5 [--steps N] [--kill-after-steps K]
//   run_file_writer --bench OUT.h5
// With --kill-after-steps every rank SIGKILLs itself after K flushed steps,
// as a job killed by Slurm would end: no destructor, no close.
#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "io_test_util.hpp"
#include "mpi_test_util.hpp"
#include "trident/core/error.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/io/run_file.hpp"

using namespace trident;

namespace {

int write_run(const std::string& path, int steps, int kill_after) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Config cfg = testing::io_test_config(size);
  auto comms = testing::io_test_comms(cfg);
  const char* job = std::getenv("SLURM_JOB_ID");
  RunFile rf(path, trident::testing::world_comm(), cfg, *comms, job ? job : "");

  const int64_t S = 2, chunk = 4, seq = 2 * size * chunk, heads = 2, hd = 3;
  for (int i = 0; i < steps; ++i) {
    std::vector<TimelineEvent> ev;
    for (int j = 0; j < 2; ++j) {
      TimelineEvent e;
      e.rank = rank;
      e.step = i;
      e.kind = j == 0 ? "F" : "B";
      e.stage = rank;
      e.microbatch = j;
      e.t_begin_s = i + 0.1 * rank + 0.01 * j;
      e.t_end_s = e.t_begin_s + 0.005;
      ev.push_back(e);
    }
    rf.append_events(ev);

    if (i == 1) {
      auto pos = testing::zigzag_positions(rank, size, chunk, false);
      std::vector<float> q;
      for (int64_t s = 0; s < S; ++s)
        for (int64_t p : pos)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t d = 0; d < hd; ++d) q.push_back(testing::tagged_value(s, p, h, d));
      rf.write_activation(1, 0, "q", {S, seq, heads, hd}, {3, 7}, q.data(), pos);
    }

    StepMetrics m;
    m.step = i;
    m.loss = 3.0 / (i + 1) + 0.125;
    m.aux_loss = 0.01 * (i + 1);
    m.lr = 1e-3 * (i + 1);
    m.grad_norm = 0.5 + i;
    m.step_time_s = 0.25 + 0.001 * i;
    m.tokens_per_s = 1000.0 * (i + 1);
    m.bubble_fraction = 0.0625 * (i + 1);
    std::array<double, 4> cb{};
    for (int k = 0; k < 4; ++k) cb[k] = 1024.0 * (i + 1) * (k + 1);
    std::vector<std::vector<int64_t>> tokens(2, std::vector<int64_t>(4));
    for (int l = 0; l < 2; ++l)
      for (int e = 0; e < 4; ++e) tokens[l][e] = 100 * i + 10 * l + e + 1;
    rf.append_step(m, cb, tokens);

    if (i + 1 == kill_after) {
      MPI_Barrier(MPI_COMM_WORLD);  // every rank's part of the step is flushed
      if (rank == 0) std::printf("run_file_writer: %d steps flushed, killing\n", kill_after);
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
  }
  RankSummary sum;
  sum.peak_rss_bytes = 1e6 * (rank + 1);
  sum.peak_device_bytes = 0;
  sum.compute_s = 1.0 + rank;
  for (int k = 0; k < 4; ++k) sum.comm_wait_s[k] = 0.5 * k + rank;
  rf.write_rank_summaries(sum);
  rf.close();
  if (rank == 0)
    std::printf("run_file_writer: wrote %s (%d steps, %d ranks)\n", path.c_str(), steps, size);
  return 0;
}

int write_bench(const std::string& path) {
  BenchTable a;
  a.name = "attention";
  a.title = "attention forward, one rank";
  a.columns = {"seq", "impl", "time_ms", "GFLOP/s"};
  for (long long s : {128LL, 256LL, 512LL})
    a.add_row({s, std::string(s == 256 ? "flash" : "naive"), 0.5 * s, 2.0 * s + 0.25});
  a.notes = {"speed-up flash/naive: 1.00", "machine: test"};
  BenchTable b;
  b.name = "comm";
  b.title = "allreduce";
  b.columns = {"size_B", "algbw_GB/s"};
  b.add_row({1024LL, 1.5});
  b.add_row({2048LL, 3.0});
  write_bench_file(path, {a, b}, "run_file_writer --bench " + path);
  std::printf("%s%s", a.format().c_str(), b.format().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    if (argc >= 3 && std::strcmp(argv[1], "--bench") == 0) {
      rc = write_bench(argv[2]);
    } else if (argc >= 2) {
      int steps = 5, kill_after = -1;
      for (int i = 2; i + 1 < argc; i += 2) {
        if (std::strcmp(argv[i], "--steps") == 0)
          steps = std::atoi(argv[i + 1]);
        else if (std::strcmp(argv[i], "--kill-after-steps") == 0)
          kill_after = std::atoi(argv[i + 1]);
        else
          throw InputError(std::string("unknown flag ") + argv[i]);
      }
      rc = write_run(argv[1], steps, kill_after);
    } else {
      throw InputError(
          "usage: run_file_writer OUT.h5 [--steps N] [--kill-after-steps K] | --bench OUT.h5");
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run_file_writer: error: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
