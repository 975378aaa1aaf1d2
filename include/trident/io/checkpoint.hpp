// Checkpoints: named float tensors (parameters, AdamW moments, router
// biases) and the run's position, under CHECKPOINT_DIR/ckpt_step_NNNNNNNN.h5.
//
// Two formats, one reader. Format 3 (output.checkpoint_format = "sharded",
// the default; io/sharded_checkpoint.hpp): every rank writes the slices it
// owns into its own shard file and that path is a small index of virtual
// datasets over them. Format 2 ("single", written here): each rank passes
// the tensors it owns (every tensor exactly once over the job), rank 0
// gathers them and writes one file under a temporary name, then renames it.
// Either way a crash never leaves a damaged "latest" checkpoint.
//
// Reading is per rank and by slice: each rank reads the parts of the tensors
// it holds (read_range), so a checkpoint restores into any mesh of the same
// model and no rank reads the whole model. Every stored dataset carries a
// checksum of its bytes; a file that does not open, lacks a tensor or a
// shard, has another shape or fails a checksum is refused with an
// InputError naming the file (the shard file too) and the tensor (not what
// asked for the read: the caller says that, e.g. --resume or a Slurm restart).
//
// Layout: /tensors/<name> float32 [shape], root attributes format =
// "trident-checkpoint", format_version (2 or 3), step (steps completed),
// optimizer_steps, model_hash, config_toml, world_size, created_utc. Version
// 1 (SwiGLU and router weights stored [in, out]) is refused (InputError).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"

namespace trident {

struct CheckpointMeta {
  int64_t step = 0;             // steps completed: the resumed run starts here
  int64_t optimizer_steps = 0;  // AdamW's t
  std::string model_hash;       // model_hash(cfg): a different model is refused
  std::string config_toml;      // the resolved config, for the record
  int64_t world_size = 1;
};

struct CheckpointTensor {
  std::string name;  // "param/<global name>", "adam_m/<name>", "adam_v/<name>", "buffer/<name>"
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// checkpoint_dir/ckpt_step_<step, 8 digits>.h5
std::string checkpoint_path(const std::string& dir, int64_t step);

// Collective over world (null: this process alone). Rank 0 creates the
// directory if needed. Returns the final path (on every rank).
std::string write_checkpoint(const std::string& dir, Communicator* world,
                             const CheckpointMeta& meta, const std::vector<CheckpointTensor>& mine);

// One process writes a whole checkpoint to `path` (temporary name, then
// renamed), e.g. a model converted from another format (trident convert).
void write_checkpoint_file(const std::string& path, const CheckpointMeta& meta,
                           const std::vector<CheckpointTensor>& tensors);

// The root attributes both formats share (format, format_version, step,
// optimizer_steps, model_hash, config_toml, world_size, created_utc) on an
// open HDF5 file (its hid_t).
void write_checkpoint_attrs(int64_t file, const CheckpointMeta& meta, int64_t format_version);

// Writes bytes to path and fsyncs them; Error "cannot write PATH: <the
// system's reason>" (a file that is only metadata: an index).
void write_file_durably(const std::string& path, const std::vector<char>& bytes);

// FNV-1a, 64 bits, of n bytes: the checksum every stored dataset carries.
uint64_t fnv1a64(const void* p, size_t n);

// The complete checkpoints in dir (index or single files named
// ckpt_step_NNNNNNNN.h5; no temporary or shard files), highest step first.
std::vector<std::string> checkpoints_newest_first(const std::string& dir);

class CheckpointReader {
 public:
  // Opens and checks the root attributes; InputError if unreadable or not a
  // trident checkpoint.
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const CheckpointMeta& meta() const { return meta_; }
  const std::string& path() const { return path_; }
  int64_t format_version() const { return version_; }
  bool has(const std::string& name) const;
  // Reads tensor `name` into out (numel of shape); InputError if missing, of
  // another shape, or its checksum does not match.
  void read(const std::string& name, const std::vector<int64_t>& shape, float* out) const;
  // Elements [begin, end) of tensor `name` (flat, row-major) into out. A
  // sharded checkpoint reads only the blocks that hold them, and checks
  // their checksums; a single file is read whole and checked.
  void read_range(const std::string& name, const std::vector<int64_t>& shape, int64_t begin,
                  int64_t end, float* out) const;
  // The shard files (names as the index lists them, in its directory) that
  // read_range(name, shape, begin, end) opens: one per piece it touches
  // (repeats possible); none for a single file. InputError as read_range.
  std::vector<std::string> shards_of(const std::string& name, const std::vector<int64_t>& shape,
                                     int64_t begin, int64_t end) const;

 private:
  std::vector<int64_t> piece_table(const std::string& name, const std::vector<int64_t>& shape,
                                   int64_t begin, int64_t end) const;
  void check_shape(const std::string& name, int64_t dset, const std::vector<int64_t>& shape) const;
  void read_single(const std::string& name, const std::vector<int64_t>& shape, float* out) const;
  void read_piece(const std::string& name, int64_t rank, int64_t pb, int64_t pe, int64_t lo,
                  int64_t hi, float* out) const;
  int64_t shard(int64_t rank) const;  // the open shard file of that rank

  std::string path_;
  int64_t file_ = -1;
  int64_t version_ = 0;
  CheckpointMeta meta_;
  std::vector<std::string> shards_;           // format 3: shard file names (by rank)
  mutable std::vector<int64_t> shard_files_;  // their open handles (-1: not yet)
};

}  // namespace trident
