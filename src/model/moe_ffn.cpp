// The MoE FFN of the model: the expert-parallel ep::MoELayer behind the
// FeedForward interface (routing, dispatch and experts are the EP layer's).
#include <algorithm>
#include <numeric>

#include "trident/core/error.hpp"
#include "trident/model/blocks.hpp"
#include "trident/parallel/ep/moe_layer.hpp"

namespace trident::model {
namespace {

class MoEFeedForward : public FeedForward {
 public:
  MoEFeedForward(const kernels::Ctx& ctx, const Config& cfg, int layer, const StageComms& comms)
      : layer_(cfg.model, layer, comms.ep, comms.cp && comms.cp->size() > 1 ? comms.cp : nullptr,
               cfg.runtime.ep_transport, cfg.runtime.ep_shm_limit_mb * 1048576.0, ctx) {
    for (int l = 0; l < layer; ++l) moe_index_ += cfg.model.is_moe_layer(l) ? 1 : 0;
  }
  std::vector<Param*> params() override { return layer_.params(); }
  void forward(const MicroBatch& mb, const float* x, int64_t T, float* y, FfnCache& c,
               FfnStats& stats) override {
    std::vector<int> sample_of_token(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) sample_of_token[size_t(t)] = int(t / mb.local_seq);
    c.moe = std::make_shared<ep::MoELayer::Cache>();
    auto& cache = *std::any_cast<std::shared_ptr<ep::MoELayer::Cache>&>(c.moe);
    ep::MoEStats s;
    layer_.forward(x, T, sample_of_token, int(mb.n_samples), y, cache, s);
    // the z-loss is trained through the same scale, so it is reported with aux
    stats.aux_loss_sum = s.aux_loss_sum + s.z_loss_sum;
    stats.moe_index = moe_index_;
    stats.tokens_per_expert = s.tokens_per_expert;
    if (stats.capture_router_logits) stats.router_logits = cache.router_logits();
  }
  void backward(const float* dy, float* dx, int64_t, FfnCache& c, float aux_scale) override {
    auto& cache = *std::any_cast<std::shared_ptr<ep::MoELayer::Cache>&>(c.moe);
    layer_.backward(dy, dx, cache, aux_scale);
    c.moe.reset();
  }
  void update_bias(const std::vector<std::vector<int64_t>>& global_load) override {
    layer_.update_bias(global_load.at(size_t(moe_index_)));
  }
  std::vector<std::pair<std::string, Tensor*>> buffers() override {
    std::vector<std::pair<std::string, Tensor*>> out;
    last_buffers_ = layer_.buffers();  // refreshes the mirror from the router
    for (Param* p : last_buffers_) out.emplace_back(p->name, &p->value);
    return out;
  }
  // The routing bias lives in the router; the buffer is a mirror of it.
  void buffers_loaded() override {
    for (Param* p : last_buffers_)
      std::copy(p->value.data.begin(), p->value.data.end(), layer_.router().bias().begin());
  }

 private:
  ep::MoELayer layer_;
  int moe_index_ = 0;
  std::vector<Param*> last_buffers_;
};

}  // namespace

std::unique_ptr<FeedForward> make_moe_ffn(const kernels::Ctx& ctx, const Config& cfg, int layer,
                                          const StageComms& comms) {
  return std::make_unique<MoEFeedForward>(ctx, cfg, layer, comms);
}

}  // namespace trident::model
