// Training data: deterministic synthetic tasks and a flat token file.
//
// A sample is a pure function of (seed, step, global sample index), so every
// mesh sees exactly the same global batch: the one-rank run and the 8-rank
// run train on the same tokens, and a resumed run continues with the samples
// the uninterrupted run would have seen (the data position is the step).
//
// Tasks (data.task):
//  "recall": BOS, then key/value pairs, then a filler stretch that counts
//            upwards (learnable), then queries "? key value" for every key,
//            in another order. Queries sit at the end of the sequence and the
//            pairs at its start, so the answer needs attention across all CP
//            ranks. Loss on every next-token target (all but the last
//            position): the filler and the query structure are learnt first
//            (the loss falls by more than half early), the recalled values
//            take it the rest of the way.
//  "copy":   a random first half, then the same tokens again; loss on the
//            second half only.
//  "tokens": windows of data.token_file (flat uint16 or uint32 ids); the
//            window of sample g of step s starts at
//            ((s * global_batch + g) * seq_len) mod (n_tokens - seq_len).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/config.hpp"

namespace trident::model {

struct Sample {
  std::vector<int32_t> tokens;   // [seq_len] inputs
  std::vector<int32_t> targets;  // [seq_len] next token, or -1 where no loss is taken
  // Packed documents (data.packing = "documents"); both empty otherwise, and
  // then the whole sequence is one document at positions 0..seq_len-1.
  //  doc_ids:   [seq_len] index of each token's document inside the sequence,
  //             0-based and non-decreasing (0,0,0,1,1,2,...): attention is
  //             causal inside a document and zero across documents.
  //  positions: [seq_len] each token's RoPE position (restarting at 0 at each
  //             document when data.reset_positions); the mask uses the
  //             sequence position, never this one.
  std::vector<int32_t> doc_ids;
  std::vector<int32_t> positions;
};

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual Sample sample(int64_t step, int64_t global_index) const = 0;
  // Every sample has this many targets (>= 0), so the loss normaliser of a
  // global batch is known without generating it.
  virtual int64_t targets_per_sample() const = 0;
};

// Throws InputError for a task the data config cannot support (vocabulary too
// small, token file missing, shorter than one sample, ids >= vocab_size).
// dp: the mesh's data-parallel size (the global batch is known from it).
std::unique_ptr<DataSource> make_data_source(const Config& cfg, int dp);

// Global batch of one step: micro_batch_size * num_microbatches * dp samples.
// Sample `slot` of micro-batch `mb` on dp rank `dp_rank` has global index
// (dp_rank * num_microbatches + mb) * micro_batch_size + slot.
inline int64_t global_sample_index(const DataConfig& d, int dp_rank, int mb, int slot) {
  return (int64_t(dp_rank) * d.num_microbatches + mb) * d.micro_batch_size + slot;
}

}  // namespace trident::model
