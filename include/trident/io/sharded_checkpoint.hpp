// Sharded checkpoints (format_version 3): every rank writes the slices of
// tensors it owns into its own HDF5 file (a shard), and rank 0 writes one
// small index, CHECKPOINT_DIR/ckpt_step_NNNNNNNN.h5, whose
// /tensors/<kind>/<name> are HDF5 virtual datasets over the shards: whole
// tensors under format 2's names, so plain h5py reads the checkpoint as
// before, also after its folder is copied or moved (the shards are named
// relative to the index).
//
// A slice is a flat element range [begin, end) of a tensor in row-major
// order, so that the owner of any contiguous part of the parameter store
// (the sharded optimizer's, or a replica's share of replicated state) writes
// it without touching anything it does not hold. Each shard dataset carries
// the fnv1a64 checksum of its bytes and of every 4 MiB block of them, so a
// rank that reads part of a slice checks what it read.
//
// Commit: shards are made durable (fsync), the ranks agree, and only then
// does the index appear (temporary name, rename, directory fsync). An index
// names its shards, so a save that dies at any point leaves the newest
// complete checkpoint as it was. Shard names carry a tag chosen once per
// run, so that a run saving a step again never writes into the files of a
// checkpoint that is already committed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/io/checkpoint.hpp"

namespace trident {

// One slice of one tensor, held by one rank.
struct ShardPiece {
  std::string name;            // "param/<global name>", "adam_m/...", "adam_v/...", "buffer/..."
  std::vector<int64_t> shape;  // the whole tensor's
  int64_t begin = 0, end = 0;  // flat element range
  int64_t numel() const { return end - begin; }
};

// Elements per checksummed block of a shard dataset (4 MiB of floats).
constexpr int64_t kChecksumBlock = int64_t(1) << 20;

// "ckpt_step_00000012.<tag>.shard00003.h5": rank 3's shard of that save.
std::string shard_file_name(int64_t step, const std::string& tag, int rank);

// One rank's shard file. Created with a dataset per piece, allocated and not
// filled (HDF5 metadata only, under h5::library_mutex); the pieces' floats
// then go in with POSIX writes at the datasets' offsets, so the writing may
// run on a background thread while the run file is written; finish()
// records the checksums and makes the file durable. Errors name the file and
// the system's reason; a file that is not finished is removed.
class ShardFile {
 public:
  // need_free: bytes the file system must have free before HDF5 writes
  // anything (this shard's, or all the shards a node writes at once: see
  // shard_file_bytes); otherwise Error "cannot write PATH: No space left on
  // device", and a read-only file system likewise, with nothing written.
  ShardFile(std::string path, const CheckpointMeta& meta, const std::string& tag, int rank,
            std::vector<ShardPiece> pieces, int64_t need_free = 0);
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  // The next n elements of piece i (each piece is written front to back).
  // No HDF5 call. Throws Error if the data holds a NaN or an infinity (such
  // a state is never written) or the write fails.
  void append(size_t i, const float* data, int64_t n);
  // Every piece complete: checksums recorded, fsync'd, closed.
  void finish();
  int64_t bytes() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  struct Progress;
  std::string path_;
  std::vector<ShardPiece> pieces_;
  std::vector<int64_t> offsets_;     // file offset of each piece's data
  std::vector<Progress*> progress_;  // owned
  int fd_ = -1;
  int64_t bytes_ = 0;
  bool finished_ = false;
};

// Generous upper bounds of the bytes a shard file and an index take on disk.
int64_t shard_file_bytes(const std::vector<ShardPiece>& pieces);
int64_t index_file_bytes(const std::vector<std::vector<ShardPiece>>& pieces);

// Rank 0: the index of a save from every rank's pieces (pieces[r]: rank r's),
// written durably under a temporary name that is returned.
std::string write_index_tmp(const std::string& dir, const CheckpointMeta& meta,
                            const std::string& tag,
                            const std::vector<std::vector<ShardPiece>>& pieces);
// The temporary index renamed into place: the save is committed.
void commit_index(const std::string& tmp, const std::string& path);

// The files of a checkpoint: the index and, for format 3, its shards.
std::vector<std::string> checkpoint_files(const std::string& index_path);
// Removes a checkpoint: its index first (it stops being complete), then its shards.
void remove_checkpoint(const std::string& index_path);
// Shard files in dir of steps <= max_step that no index there names, and
// temporary indexes of those steps (interrupted saves, saves of a step done
// again): removed; returns them.
std::vector<std::string> remove_unindexed_shards(const std::string& dir, int64_t max_step);
// The step of a checkpoint file's name (index, single file or shard;
// "ckpt_step_NNNNNNNN..."), or -1 when the name is not one.
int64_t checkpoint_step(const std::string& path);

// Steps of dir that have shard files but no index: saves that did not
// complete, newest first, for the messages of --resume.
std::vector<int64_t> unindexed_steps(const std::string& dir);

}  // namespace trident
