// CheckpointSaver: a Trainer's saves, as the job's step loop makes them.
//
// output.checkpoint_format = "sharded" (the default): each rank writes the
// slices it owns into its own shard file (io/sharded_checkpoint.hpp). Which
// rank owns what is a function of (config, mesh), computed once (the saver is
// made at the run's start): each kind of a stage's parameter store (dense, expert, none) is
// cut into equal contiguous parts over the ranks that hold a replica of it
// (dense and none: dp x cp; expert: the expert's replicas), the cut the
// sharded optimizer makes, so that with train.optimizer_sharding = "dp" a
// rank writes exactly the moments it keeps and no moment crosses a rank;
// parameters and (without the sharded optimizer) moments follow the same
// cut, which spreads replicated state evenly over its replicas. Router
// buffers go to the replicas in turn. A save then costs one small agreement.
//
// output.checkpoint_async = true: the state is copied into a host staging
// buffer of output.checkpoint_staging_mb (in waves, the earlier ones written
// at once, when the state is larger), training goes on, and a thread writes
// the last wave. The ranks learn at each step boundary, with the stop-signal
// agreement they make anyway, whether every write has finished; then rank 0
// commits the index. The next save, the end of the run and a stop signal
// wait for a save in flight. A write that fails ends the run at the next
// step boundary with its one line; the previous checkpoint stays.
//
// "single": today's one file, gathered on rank 0 (small models, export).
//
// The node-local tier (output.local_checkpoint_dir, train/local_tier.hpp) is
// a second saver of the same kind whose directory is the rank's node's:
// every node writes its own copy of the index, and before it does, each
// rank's shard goes to its partner on another node (at the commit, over
// MPI), so the step counts only when every rank agreed that its shard and
// the copy it keeps are durable.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "trident/io/run_file.hpp"
#include "trident/io/sharded_checkpoint.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {

class CheckpointSaver {
 public:
  // Collective: the ranks agree on the tag that names this run's shards, and
  // rank 0 learns every rank's slices (once per run: the index names them).
  // With local_hosts (each world rank's node label): the node-local tier.
  CheckpointSaver(Trainer& t, RunFile* file, const std::vector<std::string>* local_hosts = nullptr);
  // Waits for a writer still running; its save is not committed.
  ~CheckpointSaver();
  CheckpointSaver(const CheckpointSaver&) = delete;
  CheckpointSaver& operator=(const CheckpointSaver&) = delete;

  // Collective. Saves the state after `steps_done` steps (a save in flight
  // is completed first). Synchronous saves are committed on return.
  void save(int64_t steps_done);
  // This rank's flags for the step boundary's agreement: writing (1 while
  // its writer runs) and failed (world size - rank if its save failed, so
  // that the maximum names the lowest failing rank).
  int writing() const;
  int failed_code() const;
  // Collective, after the agreement: commits the save in flight once no
  // rank is writing; throws the failing rank's error if one failed.
  void settle(int any_writing, int failed);
  // The local tier, before the step boundary's agreement: moves the partner
  // copies on without waiting (their time counts as blocking).
  void progress() { progress_copies(false); }
  // Collective: waits for the save in flight and commits it.
  void finish();

  // The newest committed checkpoint ("" and -1: none yet).
  const std::string& last_path() const { return last_path_; }
  int64_t last_step() const { return last_step_; }

  struct Owned;  // a piece and where its floats lie on this rank

 private:
  void plan();
  void plan_kind(GradReduce kind);
  void plan_buffers();
  void start_sharded(int64_t steps_done);
  void open_files(const CheckpointMeta& meta);
  void write_waves(double t0, const CheckpointMeta& meta);
  void cut_segments();
  void writer_body(size_t first_segment, double t0, const CheckpointMeta* open);
  void commit();
  std::string commit_files();
  void share_pieces();
  void post_copy_receives();
  void progress_copies(bool wait);
  void send_copy();
  bool copies_arrived(bool wait);
  void start_copy_writer();
  void keep_copy(int owner, const std::vector<char>& framed);
  int64_t copy_bound(int rank) const;
  bool writer_running() const { return state_.load() == writing_now; }
  void save_single(int64_t steps_done);

  Trainer& t_;
  RunFile* file_;
  std::string tag_;
  bool local_ = false;         // the node-local tier
  std::string dir_;            // where the shards go
  bool index_writer_ = false;  // writes the index: rank 0 (each node's lowest rank: local)
  int partner_ = -1;           // local: the rank keeping this rank's copy
  std::vector<int> kept_for_;  // local: the ranks whose copies this rank keeps
  int64_t own_bound_ = 0;      // local: the framed size of this rank's copy
  // local, the save in flight: the copies going out and coming in
  std::vector<char> outgoing_;
  std::vector<std::vector<char>> incoming_;
  std::vector<Request> copy_reqs_;
  bool sent_ = false, copies_sent_ = false;
  std::atomic<bool> copies_done_{false};
  std::vector<Owned> owned_;
  std::vector<std::vector<ShardPiece>> all_pieces_;  // index writers: every rank's
  int64_t node_bytes_ = 0;  // disk bytes this host's ranks write in one save

  // the save in flight
  std::unique_ptr<ShardFile> shard_;
  std::string index_tmp_, pending_path_;
  int64_t pending_step_ = -1;
  Tensor staging_;
  struct Segment {
    size_t piece;
    int64_t from, n;  // elements [from, from + n) of the piece
    int64_t at;       // where they lie in the staging buffer
  };
  std::vector<Segment> segments_;
  std::thread writer_;
  enum State { idle = 0, writing_now = 1, written = 2, failed_now = 3 };
  std::atomic<int> state_{idle};
  std::string error_;
  double write_s_ = 0, blocking_s_ = 0;
  int64_t bytes_ = 0;

  std::string last_path_;
  int64_t last_step_ = -1;
};

}  // namespace trident::train
