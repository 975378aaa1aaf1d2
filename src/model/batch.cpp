// Cutting a step's global batch into this rank's micro-batches.
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
    }
  }
  return out;
}

}  // namespace trident::model
