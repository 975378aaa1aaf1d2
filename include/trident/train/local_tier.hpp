// The node-local checkpoint tier (output.local_checkpoint_dir, faults.md):
// where a node keeps its ranks' shards and its partner copies, which rank
// keeps whose copy, moving a file's bytes between ranks, and the restore of
// the newest step complete across the nodes that are left.
//
// Layout: LOCAL/trident-<SLURM_JOB_ID, or "run">/<node label>/ holds the
// shards of the node's ranks, the partner copies it keeps (byte-identical
// files, under the owner's shard name) and, once every rank agreed that all
// of them are durable, the step's index (each node writes its own copy).
// A rank reads only its own node's directory: a lost node's files are gone.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"

namespace trident::train {

// LOCAL/trident-<job> and that/<label> ('/' of a virtual node's label -> '_').
std::string local_job_dir(const OutputConfig& o);
std::string local_node_dir(const OutputConfig& o, const std::string& node_label);

// Each rank's partner (hosts[r]: rank r's node label): the rank at the same
// position on the next node, so a node's ranks have their copies on one
// other node and every rank keeps exactly one copy. -1 for every rank when
// there is one node.
std::vector<int> partner_ranks(const std::vector<std::string>& hosts);

// A file's bytes from rank `from` to rank `to` (size first); both call it,
// the others return at once. The receiver gets the bytes.
std::vector<char> move_bytes(Communicator& world, int from, int to, std::vector<char> bytes,
                             int tag);
std::vector<char> read_file_bytes(const std::string& path);
// n bytes into path, durably: a temporary name, fsync, rename (Error with
// the system's reason).
void write_bytes_durably(const std::string& path, const char* data, size_t n);

// Removes the files of every step but `step` from a node directory (the
// tier keeps its newest committed step only).
void remove_local_steps_except(const std::string& dir, int64_t step);

// The shard files a rank's load reads from a sharded index (names in its
// directory): checkpoint_shards_read of the rank's trainer.
using ShardsRead = std::function<std::vector<std::string>(const std::string& index_path)>;

// Collective. The newest step of the local tier that is complete across the
// ranks' node directories and newer than `newer_than` (a lost node's shards
// as their partner copies on the next node): its index is copied into every
// node's directory, then each node gets the shards its ranks read
// (shards_read) that it lacks, over MPI; the index there is returned, and
// `why` says how many files moved ("" when none: `why` says what was
// missing, for the line).
std::string restore_local(Communicator& world, const std::string& my_dir, int64_t newer_than,
                          const ShardsRead& shards_read, std::string& why);

// Removes this job's local tier on a clean finish: each node's directory
// (its lowest rank), then the job's directory if empty.
void clean_local_tier(Communicator& world, const OutputConfig& o,
                      const std::vector<std::string>& hosts);

}  // namespace trident::train
