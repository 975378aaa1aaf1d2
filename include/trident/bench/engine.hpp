// The benchmark engine: what every `trident bench` measurement shares, so that
// a benchmark is a table of cases (src/bench/<name>.cpp) and the CLI only
// parses its flags (src/cli/bench_<name>.cpp). It owns
//   - the data: rows of a [seq, heads, D] tensor at global positions, the same
//     numbers whichever rank draws them (rows_at);
//   - the reference spot check: output rows against the fp64 definition
//     (SpotCheck, check_attention_row);
//   - the timers: wall time from core/clock (now_s; device_now_s after the
//     device's stream has finished), CPU time of the process or the calling
//     thread;
//   - the measurement plumbing: every rank's per-iteration values gathered
//     and reduced per iteration (RankSeries), a table's fixed parts (TableSpec);
//   - the verdict: "# wrong ... in total: N (OK|FAILED)", the error line and
//     the exit code (Verdict);
//   - the job: the communicators and the device chosen from a config as
//     `trident run` chooses them (BenchJob), with device buffers;
//   - the report: tables printed on rank 0 and written to HDF5 (io/bench_report).
//   - one process's kernels: the best wall and thread CPU time of a call, the
//     CPU's model name, tensors drawn in f32 or bf16 with the values they hold
//     (time_best, cpu_model_name, drawn_tensor).
// share/trident/design.md, "Adding a benchmark", is the recipe.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/clock.hpp"
#include "trident/core/config.hpp"
#include "trident/core/tensor.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/backend.hpp"
#include "trident/kernels/types/attention.hpp"
#include "trident/topo/topology.hpp"

namespace trident::bench {

// ---- data ------------------------------------------------------------------

// Rows of a [seq, heads, D] tensor (row_elems = heads * D) at the given global
// positions, drawn from the stream `name`: element (p, h, d) is the same
// number whichever rank generates it.
std::vector<float> rows_at(const std::vector<int64_t>& positions, int64_t row_elems,
                           const char* name);
// 0, 1, ..., seq - 1.
std::vector<int64_t> all_positions(int64_t seq);

// ---- reference spot check --------------------------------------------------

// The worst relative L2 error seen and the rows off by more than tol.
struct SpotCheck {
  double tol = 1e-4;
  double worst = 0;
  long long wrong = 0;
  // One row: got[0:n] against the fp64 reference ref[0:n].
  void add(const float* got, const double* ref, int64_t n);
};

// Query row `row` (head `head`) of q against attention_reference_row over the
// full k and v of shape s; out_row: the output row measured.
void check_attention_row(SpotCheck& check, const kernels::AttnShape& s, const float* q,
                         const float* k, const float* v, int64_t row, int head,
                         const float* out_row);

// ---- timers ----------------------------------------------------------------

// CPU time of this process (all its threads), seconds.
double process_cpu_s();
// CPU time of the calling thread (not inflated by waiting for a core), seconds.
double thread_cpu_s();
// now_s() once the work enqueued on ctx's stream has finished
// (kernels::synchronize): the clock a timed loop over device buffers reads,
// before and after the work, so that on a GPU the time covers the kernels
// and copies, not only their launches (the host and the emulated device
// have nothing to wait for).
double device_now_s(const kernels::Ctx& ctx);

// ---- measurements over ranks -----------------------------------------------

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

// ---- report and verdict ----------------------------------------------------

// Prints t (and a blank line) on rank 0, flushed.
void print_table(const BenchTable& t, int rank);

// The benchmark's verdict: wrong counts added up (each already summed over
// ranks), "# LABEL: N (OK|FAILED)" on rank 0, exit code 1 when any.
class Verdict {
 public:
  // label: "wrong rows in total", "wrong elements or byte counts".
  explicit Verdict(std::string label) : label_(std::move(label)) {}
  void add(long long wrong) { wrong_ += wrong; }
  long long wrong() const { return wrong_; }
  void print(int rank) const;
  // When wrong, on rank 0's stderr: "trident: error: BENCH: N WHAT".
  void print_error(int rank, const std::string& bench, const std::string& what) const;
  int exit_code() const { return wrong_ ? 1 : 0; }

 private:
  std::string label_;
  long long wrong_ = 0;
};

// Tables to the HDF5 file `path` from rank 0 ("" writes nothing).
void write_report(const std::string& path, const std::vector<BenchTable>& tables, int rank,
                  const std::string& command_line);

// ---- flags shared by benches -----------------------------------------------

// 8, 64K, 16M, 1G (binary multiples); flag names the option in the error.
size_t parse_size(const std::string& flag, const std::string& text);
// The items of a comma-separated value.
std::vector<std::string> split_list(const std::string& list);

// ---- one process's kernels: timing, the host named, drawn tensors ---------
// (src/bench/engine_host.cpp)

// Best (smallest) wall and CPU time of the calling thread over reps calls of
// f, each taken independently; the CPU time is not inflated by time slices
// lost to other processes on a loaded host.
struct BestTimes {
  double wall_s = 1e300, cpu_s = 1e300;
};
template <class F>
BestTimes time_best(int reps, F&& f) {
  BestTimes b;
  for (int r = 0; r < reps; ++r) {
    const double w0 = now_s(), c0 = thread_cpu_s();
    f();
    const double c1 = thread_cpu_s(), w1 = now_s();
    b.wall_s = w1 - w0 < b.wall_s ? w1 - w0 : b.wall_s;
    b.cpu_s = c1 - c0 < b.cpu_s ? c1 - c0 : b.cpu_s;
  }
  return b;
}

// The CPU's model name ("AMD EPYC 9R14 96-Core Processor"; /proc/cpuinfo's
// first "model name", "unknown CPU" where there is none), for table notes.
std::string cpu_model_name();

// A host tensor of `shape` and `dtype` (f32 or bf16) drawn from the normal
// stream `stream` (rounded to nearest even for bf16), on ctx's host device;
// values: the f32 numbers it holds (bf16 widens exactly), for an fp64
// reference of the rounded inputs.
Tensor drawn_tensor(const kernels::Ctx& ctx, const std::vector<int64_t>& shape, const char* stream,
                    DType dtype, std::vector<float>& values);

// ---- the job ---------------------------------------------------------------

// The communicators and the device of a benchmark run, made from a config
// exactly as `trident run` makes them: topology, mesh groups on runtime.comm's
// backend (MPI, or NCCL), the rank's device from runtime.backend, and MPI
// groups staging device buffers through the host as the trainer's do.
struct BenchJob {
  std::unique_ptr<Communicator> job;  // MPI world (control)
  std::unique_ptr<Communicators> comms;
  // Every rank as one group on runtime.comm's backend: what "world" means to
  // a benchmark (comms->world stays on MPI, the control communicator).
  std::unique_ptr<Communicator> all;
  std::unique_ptr<kernels::DeviceContext> device;  // where the benchmark's buffers live

  Communicator& world() { return *comms->world; }
  const kernels::Ctx& ctx() const { return device->ctx(); }
};
// Collective over MPI's world; cfg already checked (train::check_config).
BenchJob open_job(const Config& cfg);
// The group named world (BenchJob::all), cp, pp, dp, dpcp or ep.
Communicator& mesh_group(BenchJob& job, const std::string& name);

// ---- device buffers and sharded attention ----------------------------------

// v on ctx's device, a 1-D f32 tensor of v.size() elements.
Tensor to_device(const kernels::Ctx& ctx, const std::vector<float>& v);
// rows_at(positions, row_elems, name) on ctx's device, [positions, row_elems].
Tensor device_rows_at(const kernels::Ctx& ctx, const std::vector<int64_t>& positions,
                      int64_t row_elems, const char* name);

// A sharded attention's inputs and outputs at `positions`, on ctx's device:
// q, k, v and dout drawn by rows_at ("ring.q", "ring.k", "ring.v",
// "ring.do": the names check_sharded_rows reads back), out, lse, dq, dk, dv
// allocated; H query heads, Hkv kv heads of D.
struct AttentionTensors {
  AttentionTensors() = default;
  AttentionTensors(const kernels::Ctx& ctx, const std::vector<int64_t>& positions, int64_t H,
                   int64_t Hkv, int64_t D);
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
};

// The output of an attention sharded over ranks, checked row by row against
// the fp64 definition over the whole sequence: local rows `rows` (head 0) of
// out [T_local, H, D] (on ctx's device), whose global positions are
// positions[row]. q, k and v are regenerated with rows_at from the streams
// q_name, k_name and v_name (k and v over all s.Tk positions). s: the whole
// sequence's shape (Tk = the sequence; Tq, q_pos0 and q_doc are set per
// row; k_doc, when set, holds the document id of every position, so a row's
// q_doc is k_doc + its position).
void check_sharded_rows(SpotCheck& check, const kernels::Ctx& ctx, kernels::AttnShape s,
                        const std::vector<int64_t>& positions, const std::vector<int64_t>& rows,
                        const Tensor& out, const char* q_name, const char* k_name,
                        const char* v_name);

}  // namespace trident::bench
