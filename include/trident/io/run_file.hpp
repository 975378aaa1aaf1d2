// RunFile: the HDF5 file of one run (format "trident-run", version 2), written
// with parallel HDF5 by all ranks. Layout: share/trident/hdf5-layout.md.
//
// Every method is collective over the world communicator unless it says
// otherwise. Metrics rows are appended and the file is flushed every step, so
// a killed run leaves a readable file holding every completed step. A write
// that fails (file system full or read-only) throws Error "output file PATH:
// cannot <what>: <the system's reason>" on the ranks that saw it fail.
#pragma once
#include <hdf5.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/io/timeline_event.hpp"
#include "trident/topo/topology.hpp"

namespace trident {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, aux_loss = 0, z_loss = 0, lr = 0, grad_norm = 0;
  double step_time_s = 0, tokens_per_s = 0, bubble_fraction = 0;
};

// One validation of /metrics/eval: after `step` training steps.
struct EvalMetrics {
  int64_t step = 0;
  double loss = 0, perplexity = 0;  // mean cross-entropy over `targets`, exp(loss)
  int64_t targets = 0;
};

// A row of /metrics/checkpoints: one save, agreed by every rank.
struct CheckpointRecord {
  int64_t step = 0;          // steps completed at the save
  double blocking_s = 0;     // training stopped for it (the slowest rank)
  double write_s = 0;        // start of the save to durable on disk (the slowest rank)
  int64_t bytes = 0;         // tensor bytes written by all ranks
  int32_t slowest_rank = 0;  // the rank whose write took write_s
  int32_t async = 0;         // 1: written in the background
  int32_t local = 0;         // 1: the node-local tier (output.local_checkpoint_dir)
};

// Something the step guards saw (/events): kind is "nonfinite" (a step's
// loss, aux losses or gradient norm not finite), "loss_spike",
// "verify_mismatch" or "stop" (the guards ended the job); value and reference
// depend on the kind (share/trident/hdf5-layout.md).
struct RunEvent {
  int64_t step = 0;
  std::string kind;   // at most 15 characters
  int32_t rank = -1;  // the rank it concerns (-1: none in particular)
  double value = 0, reference = 0;
  std::string detail;  // at most 1023 bytes kept
};

// Per-rank scalar summary written once at the end (/ranks/summary).
struct RankSummary {
  int32_t rank = 0;
  double peak_rss_bytes = 0, peak_device_bytes = 0;
  double peak_alloc_bytes = 0;  // the host allocator's peak (tensors, workspaces)
  double compute_s = 0, comm_wait_s[4] = {0, 0, 0, 0};
  // The training allocator's bytes in use by kind (core/allocator.hpp's
  // MemKind order) when it reached its peak: they sum to peak_device_bytes
  // on a device, else to peak_alloc_bytes.
  double peak_kind_bytes[6] = {0, 0, 0, 0, 0, 0};
};

// A row of /ranks/steps: one rank's seconds over a window of
// output.rank_stats_every steps, with rank 0's scores (train/rank_stats.hpp).
struct RankStepRow {
  int64_t step = 0;   // the window's first step
  int32_t steps = 0;  // steps in the window
  int32_t rank = 0;
  char host[64] = {};
  int32_t stage = 0;  // pipeline rank
  // forward, backward, weight, optimizer, data, checkpoint (waits left out)
  double compute_s[6] = {0, 0, 0, 0, 0, 0};
  double wait_s[4] = {0, 0, 0, 0};  // cp, pp, ep, dp
  int32_t peer = -1;                // the pipeline peer waited on longest
  double peer_wait_s = 0;
  double step_s = 0;       // the rank's wall time of the window's steps
  double waited_on_s = 0;  // other ranks' waits attributed to this rank
  double score = 0;        // compute per step / its stage's other ranks' median
  double score_best = 0;   // / its stage's fastest rank
  double score_self = 0;   // / the median of its own earlier windows (0: none yet)
};

class RunFile {
 public:
  // Creates path (collective) and writes the root attributes and /topology.
  // Callers create it only after every input has been validated, so bad input
  // never leaves a file behind; a killed run leaves it readable up to the last
  // flushed step.
  // world: every rank of the job (its host group opens the file).
  RunFile(const std::string& path, Communicator& world, const Config& cfg,
          const Communicators& comms, const std::string& slurm_job_id);
  ~RunFile();
  RunFile(const RunFile&) = delete;
  RunFile& operator=(const RunFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t steps_written() const { return steps_; }
  int64_t events_written() const { return events_; }
  // The open file, for a layer that adds its own group (every rank must make
  // the same metadata calls in the same order: parallel HDF5's rule).
  hid_t h5_file() const { return file_; }

  // Rank 0's values are written; collective (dataset extension). Flushes the
  // file, so the row survives a crash that follows.
  void append_step(
      const StepMetrics& m, const std::array<double, 4>& comm_bytes_all_ranks,
      const std::vector<std::vector<int64_t>>& expert_tokens /* [moe_layer][expert] */);
  // Each rank passes its own events; collective. One call appends every
  // rank's events, rank 0's first. kind has at most 15 characters.
  void append_events(const std::vector<TimelineEvent>& mine);
  // Activation capture: each rank passes its shard `local` of shape
  // [S, local_seq, rest...] and the global sequence position of each of its
  // local_seq rows; the dataset [S, seq, rest...] is in global order.
  // Ranks that hold no part pass local_seq = 0 (still collective). Every rank
  // passes the same step, layer, name, global_shape and sample_ids; exactly
  // one rank writes each position (unwritten positions read as NaN).
  void write_activation(int step, int layer, const std::string& name,
                        const std::vector<int64_t>& global_shape,
                        const std::vector<int>& sample_ids, const float* local,
                        const std::vector<int64_t>& global_positions);
  // Every rank passes the same event (rank 0's is written); collective.
  void append_event(const RunEvent& e);
  // A row of /metrics/eval (rank 0's is written); collective, flushes.
  void append_eval(const EvalMetrics& m);
  // A row of /metrics/checkpoints (rank 0's is written); collective, flushes.
  void append_checkpoint(const CheckpointRecord& r);
  // /data/<name>: a length histogram in power-of-two bins (rank 0's
  // counts; every rank passes the same name); collective, once per name.
  void write_length_histogram(const std::string& name, const std::vector<int64_t>& counts,
                              const std::string& description);
  // Per-rank summary at the end; collective.
  void write_rank_summaries(const RankSummary& mine);
  // Rows of /ranks/steps: rank 0 passes one per world rank, the others
  // pass none; collective. Not flushed: the step loop flushes each step.
  void append_rank_steps(const std::vector<RankStepRow>& rows);
  // Free-form attribute on the root group (rank 0's value); collective.
  void set_root_attr(const std::string& name, const std::string& value);
  void set_root_attr(const std::string& name, double value);
  void set_root_attr(const std::string& name, int64_t value);
  void flush();
  // Marks the run complete (root attribute completed = 1) and closes (collective).
  void close();

 private:
  // Rank 0's value of a root attribute, written once the ranks agree on its name.
  template <class T>
  void write_root_attr(const std::string& name, T value);

  std::string path_;
  Communicator& world_;  // host (MPI) group: collectives and the MPI-IO driver
  int rank_ = 0, size_ = 1;
  hid_t file_ = -1;
  int64_t steps_ = 0, events_ = 0, run_events_ = 0, evals_ = 0, checkpoints_ = 0;
  int64_t rank_steps_ = 0;  // rows of /ranks/steps
  int moe_layers_ = 0, n_experts_ = 0;
  bool closed_ = false;
};

// Resolve output.file: %j -> job id or "local-<UTC timestamp>" (same on all
// ranks: rank 0's is broadcast).
std::string resolve_output_name(const std::string& pattern, Communicator& world);

}  // namespace trident
