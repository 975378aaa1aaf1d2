// The MoE FFN of the model: the expert-parallel ep::MoELayer behind the
// FeedForward interface.
#include "trident/core/error.hpp"
#include "trident/model/blocks.hpp"

namespace trident::model {

std::unique_ptr<FeedForward> make_moe_ffn(const Config& cfg, int layer, const StageComms& comms) {
  throw Error("MoE layers need ep::MoELayer, which is not built yet");
}

}  // namespace trident::model
