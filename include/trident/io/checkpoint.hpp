// Checkpoints: one HDF5 file per checkpoint holding named float tensors
// (parameters, AdamW moments, router biases) and the run's position.
//
// Writing is collective over the world: each rank passes the tensors it OWNS
// (every tensor exactly once over the job), rank 0 gathers them and writes
// the file under a temporary name, then renames it, so a crash never leaves a
// damaged "latest" checkpoint. Reading is per rank: each opens the file and
// takes the names it holds, so a checkpoint restores into any mesh of the
// same model. Every dataset carries a checksum of its bytes; a file that does
// not open, lacks a tensor, has another shape or fails a checksum is refused
// with an InputError naming the file and the problem (not what asked for the
// read: the caller says that, e.g. --resume or a Slurm restart).
//
// Layout: /tensors/<name> float32 (attribute fnv1a64), root attributes
// format = "trident-checkpoint", format_version = 2, step (steps completed),
// optimizer_steps, model_hash, config_toml, world_size, created_utc. A file
// of another format_version is refused (InputError): version 1 stored the
// SwiGLU and router weights [in, out], version 2 stores every weight
// [out, in].
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
std::string write_checkpoint(const std::string& dir, Communicator* world, const CheckpointMeta& meta,
                             const std::vector<CheckpointTensor>& mine);

// One process writes a whole checkpoint to `path` (temporary name, then
// renamed), e.g. a model converted from another format (trident convert).
void write_checkpoint_file(const std::string& path, const CheckpointMeta& meta,
                           const std::vector<CheckpointTensor>& tensors);

// The complete checkpoints in dir (no temporary files), highest step first.
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
  bool has(const std::string& name) const;
  // Reads tensor `name` into out (numel of shape); InputError if missing, of
  // another shape, or its checksum does not match.
  void read(const std::string& name, const std::vector<int64_t>& shape, float* out) const;

 private:
  std::string path_;
  int64_t file_ = -1;
  CheckpointMeta meta_;
};

}  // namespace trident
