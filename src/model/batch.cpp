// Cutting a step's global batch into this rank's micro-batches.
#include "trident/core/error.hpp"
#include "trident/model/transformer.hpp"
#include "trident/parallel/cp/document_layout.hpp"

namespace trident::model {

namespace {

// Per sample (context parallel by documents): the sample's own layout, and
// this rank's token positions in it (none when the sample has no documents).
std::vector<int64_t> own_positions(MicroBatch& mb, const Sample& smp,
                                   const DocumentBalance& by_docs, int64_t Ls) {
  std::vector<int64_t> own;
  mb.layouts.emplace_back();
  if (!smp.doc_ids.empty()) {
    TRIDENT_CHECK(smp.doc_ids.size() == smp.tokens.size(),
                  "make_microbatches: a sample's doc_ids do not match its tokens");
    mb.layouts.back() = cp::balance_documents(smp.doc_ids.data(), int64_t(smp.tokens.size()),
                                              by_docs.cp, by_docs.window);
    own = cp::run_positions(mb.layouts.back()[size_t(by_docs.rank)]);
    TRIDENT_CHECK(int64_t(own.size()) == Ls,
                  "make_microbatches: a sample's document layout does not give this rank "
                  "its share of tokens");
  }
  return own;
}

// The sample's document ids at pos, after `before` tokens of earlier samples.
void append_doc_ids(MicroBatch& mb, const Sample& smp, const std::vector<int64_t>& pos,
                    size_t before, int64_t Ls) {
  if (!smp.doc_ids.empty()) {
    TRIDENT_CHECK(smp.doc_ids.size() == smp.tokens.size(),
                  "make_microbatches: a sample's doc_ids do not match its tokens");
    mb.doc_ids.resize(before, 0);  // earlier samples without documents: one each
    for (int64_t p : pos) mb.doc_ids.push_back(smp.doc_ids[size_t(p)]);
  } else if (!mb.doc_ids.empty()) {
    mb.doc_ids.resize(before + size_t(Ls), 0);
  }
}

// The sample's RoPE positions at pos, after `before` tokens of earlier samples.
void append_rope_positions(MicroBatch& mb, const Sample& smp, const std::vector<int64_t>& pos,
                           const std::vector<int64_t>& positions, size_t before, int64_t Ls,
                           bool per_sample) {
  if (!smp.positions.empty()) {
    TRIDENT_CHECK(smp.positions.size() == smp.tokens.size(),
                  "make_microbatches: a sample's positions do not match its tokens");
    for (size_t t = mb.rope_positions.size(); t < before; ++t)
      mb.rope_positions.push_back(positions[t % size_t(Ls)]);
    for (int64_t p : pos) mb.rope_positions.push_back(smp.positions[size_t(p)]);
  } else if (!mb.rope_positions.empty() || per_sample) {
    // RoPE at the global positions; per sample, they differ between samples
    mb.rope_positions.resize(before);
    mb.rope_positions.insert(mb.rope_positions.end(), pos.begin(), pos.end());
  }
}

}  // namespace

std::vector<MicroBatch> make_microbatches(const DataSource& data, const DataConfig& d, int64_t step,
                                          int dp_rank, const std::vector<int64_t>& positions,
                                          const DocumentBalance& by_docs) {
  std::vector<MicroBatch> out(static_cast<size_t>(d.num_microbatches));
  const int64_t Ls = static_cast<int64_t>(positions.size());
  const bool per_sample = by_docs.cp > 1;
  for (int m = 0; m < d.num_microbatches; ++m) {
    MicroBatch& mb = out[size_t(m)];
    mb.n_samples = d.micro_batch_size;
    mb.local_seq = Ls;
    mb.positions = positions;
    for (int s = 0; s < d.micro_batch_size; ++s) {
      const int64_t g = global_sample_index(d, dp_rank, m, s);
      mb.sample_ids.push_back(g);
      Sample smp = data.sample(step, g);
      // This sample's tokens: its own layout's (docs), or the fixed ones.
      const std::vector<int64_t> own =
          per_sample ? own_positions(mb, smp, by_docs, Ls) : std::vector<int64_t>{};
      const std::vector<int64_t>& pos = own.empty() ? positions : own;
      for (int64_t p : pos) {
        mb.tokens.push_back(smp.tokens[size_t(p)]);
        mb.targets.push_back(smp.targets[size_t(p)]);
      }
      if (per_sample) mb.seq_positions.insert(mb.seq_positions.end(), pos.begin(), pos.end());
      const size_t before = size_t(s * Ls);  // tokens of the earlier samples
      append_doc_ids(mb, smp, pos, before, Ls);
      append_rope_positions(mb, smp, pos, positions, before, Ls, per_sample);
    }
  }
  return out;
}

}  // namespace trident::model
