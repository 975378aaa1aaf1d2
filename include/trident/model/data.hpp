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
//  "tokens": windows of a token stream: data.token_file (flat uint16 or
//            uint32 ids), a Megatron dataset (data.prefix) or a blend of
//            several (data.blend), each cut by data.split into a training
//            and a validation part (share/trident/data.md). Sample g of
//            step s is number i = s * global_batch + g of the stream; with
//            one dataset its window starts at
//            (i * seq_len) mod (n_tokens - seq_len) of the part (as before
//            blends existed), with a blend dataset d's k-th window, where the
//            blend's fixed interleaving gives d and k (see make_blend_order).
//            data.packing = "documents": the window's document boundaries
//            fill doc_ids and positions, and the target of a document's last
//            token is -1 (no loss across a boundary).
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
  // Every sample has at most this many targets (>= 0); exactly this many
  // unless documents are packed.
  virtual int64_t targets_per_sample() const = 0;
  // Targets of samples [0, n_samples) of step (the loss normaliser of a
  // global batch), known without reading the tokens.
  virtual int64_t targets_in_batch(int64_t step, int64_t n_samples) const {
    return n_samples * targets_per_sample();
  }
  // Length histogram of the documents this source draws from (whole
  // documents, before packing cuts them); empty for synthetic tasks.
  virtual std::vector<int64_t> document_lengths_log2() const { return {}; }
};

// Lengths in power-of-two bins: bin b counts lengths in [2^b, 2^(b+1)).
void add_log2_length(std::vector<int64_t>& bins, int64_t length);

// Which part of data.split a source reads: training, or validation (the
// validation share, or eval.token_file / eval.prefix when given).
enum class DataPart { train, validation };

// Throws InputError for a task the data config cannot support (vocabulary too
// small, token file missing, shorter than one sample, ids >= vocab_size).
// dp: the mesh's data-parallel size (the global batch is known from it).
std::unique_ptr<DataSource> make_data_source(const Config& cfg, int dp,
                                             DataPart part = DataPart::train);

// A blend's interleaving of `block` samples: which dataset each takes, so
// that every block gives dataset d its share round(weight_d * block) (within
// one). Sample i of the stream takes dataset order[i % block].
std::vector<int> make_blend_order(const std::vector<double>& weights, int block);

// Global batch of one step: micro_batch_size * num_microbatches * dp samples.
// Sample `slot` of micro-batch `mb` on dp rank `dp_rank` has global index
// (dp_rank * num_microbatches + mb) * micro_batch_size + slot.
inline int64_t global_sample_index(const DataConfig& d, int dp_rank, int mb, int slot) {
  return (int64_t(dp_rank) * d.num_microbatches + mb) * d.micro_batch_size + slot;
}

}  // namespace trident::model
