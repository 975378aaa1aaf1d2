// Cutting a step's global batch into this rank's micro-batches.
#include "trident/core/error.hpp"
#include "trident/model/transformer.hpp"

namespace trident::model {

std::vector<MicroBatch> make_microbatches(const DataSource& data, const DataConfig& d, int64_t step,
                                          int dp_rank, const std::vector<int64_t>& positions) {
  std::vector<MicroBatch> out(static_cast<size_t>(d.num_microbatches));
  const int64_t Ls = static_cast<int64_t>(positions.size());
  for (int m = 0; m < d.num_microbatches; ++m) {
    MicroBatch& mb = out[size_t(m)];
    mb.n_samples = d.micro_batch_size;
    mb.local_seq = Ls;
    mb.positions = positions;
    for (int s = 0; s < d.micro_batch_size; ++s) {
      const int64_t g = global_sample_index(d, dp_rank, m, s);
      mb.sample_ids.push_back(g);
      Sample smp = data.sample(step, g);
      for (int64_t p : positions) {
        mb.tokens.push_back(smp.tokens[size_t(p)]);
        mb.targets.push_back(smp.targets[size_t(p)]);
      }
      const size_t before = size_t(s * Ls);  // tokens of the earlier samples
      if (!smp.doc_ids.empty()) {
        TRIDENT_CHECK(smp.doc_ids.size() == smp.tokens.size(),
                      "make_microbatches: a sample's doc_ids do not match its tokens");
        mb.doc_ids.resize(before, 0);  // earlier samples without documents: one each
        for (int64_t p : positions) mb.doc_ids.push_back(smp.doc_ids[size_t(p)]);
      } else if (!mb.doc_ids.empty()) {
        mb.doc_ids.resize(before + size_t(Ls), 0);
      }
      if (!smp.positions.empty()) {
        TRIDENT_CHECK(smp.positions.size() == smp.tokens.size(),
                      "make_microbatches: a sample's positions do not match its tokens");
        for (size_t t = mb.rope_positions.size(); t < before; ++t)
          mb.rope_positions.push_back(positions[t % size_t(Ls)]);
        for (int64_t p : positions) mb.rope_positions.push_back(smp.positions[size_t(p)]);
      } else if (!mb.rope_positions.empty()) {
        mb.rope_positions.insert(mb.rope_positions.end(), positions.begin(), positions.end());
      }
    }
  }
  return out;
}

}  // namespace trident::model
