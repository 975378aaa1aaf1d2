// pp > 1: the step's micro-batches run under the configured schedule through
// the pipeline executor; the model stage is the executor's unit of work.
#include "trident/core/error.hpp"
#include "trident/train/trainer.hpp"

namespace trident::train {

void Trainer::init_pipeline() {
  throw Error("pipeline parallelism (pp > 1) needs the pipeline executor, which is not built yet");
}

void Trainer::run_pipeline(int64_t, std::vector<TimelineEvent>&, double&) {}

}  // namespace trident::train
