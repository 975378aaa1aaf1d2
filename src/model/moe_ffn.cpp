// The MoE FFN of the model: the expert-parallel ep::MoELayer behind the
// FeedForward interface (routing, dispatch and experts are the EP layer's).
#include <algorithm>
#include <numeric>

#include "trident/core/error.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/model/blocks.hpp"
#include "trident/parallel/ep/moe_layer.hpp"

namespace trident::model {
namespace {

struct MoEState : FfnState {
  ep::MoELayer::Cache cache;
};

class MoEFeedForward : public FeedForward {
 public:
  // The experts' weights are GEMM weights of `precision` (bf16 copies or
  // packed masters under train.precision = "bf16", refreshed with the dense
  // ones), and their input rows and saved gate and up are bf16 there too;
  // the router's small GEMM reads its fp32 weight and the normed x in f32.
  MoEFeedForward(const kernels::Ctx& ctx, const Config& cfg, int layer, const StageComms& comms,
                 GemmPrecision& precision)
      : ctx_(ctx),
        layer_(cfg.model, layer, comms.ep, comms.cp && comms.cp->size() > 1 ? comms.cp : nullptr,
               cfg.runtime.ep_transport, cfg.runtime.ep_shm_limit_mb * 1048576.0, ctx) {
    for (int l = 0; l < layer; ++l) moe_index_ += cfg.model.is_moe_layer(l) ? 1 : 0;
    for (int e = 0; e < layer_.local_experts(); ++e)
      for (int w = 0; w < 3; ++w) precision.add(layer_.expert_param(e, w));
    if (precision.bf16()) {
      layer_.set_gemm_weights(
          [&precision](const Param& p) -> const Tensor& { return precision.weight(p); },
          [&precision](const Param& p) { return precision.packed(p); });
      layer_.set_expert_activations(DType::bf16);  // as the dense FFN's
    }
  }
  std::vector<Param*> params() override { return layer_.params(); }
  void forward(const MicroBatch& mb, const Tensor& x, const Tensor& y, FfnCache& c,
               FfnStats& stats) override {
    auto state = std::make_unique<MoEState>();
    auto& cache = state->cache;
    c.moe = std::move(state);
    ep::MoEStats s;
    c.x = x;  // the layer keeps x's rows until backward (the block's cache owns them)
    layer_.forward(x, mb.on_device.sample_of_token, int(mb.n_samples), y, cache, s,
                   &mb.on_device.token_index);
    stats.aux_loss_sum = s.aux_loss_sum;
    stats.z_loss_sum = s.z_loss_sum;
    stats.moe_index = moe_index_;
    stats.tokens_per_expert = s.tokens_per_expert;
    if (stats.capture_router_logits) {  // the capture's one explicit copy to the host
      const Tensor host = kernels::to_host(ctx_, cache.router_logits());
      stats.router_logits.assign(host.ptr(), host.ptr() + host.numel());
    }
  }
  void backward(const Tensor& dy, const Tensor& dx, FfnCache& c, float aux_scale) override {
    auto& cache = static_cast<MoEState&>(*c.moe).cache;
    layer_.backward(dy, dx, cache, aux_scale);
    c.moe.reset();
  }
  // The layer's cache holds x: drop() lets it go with the block's (so that
  // its memory is freed), recompute() gives it the new x.
  void drop(FfnCache& c) override {
    auto& cache = static_cast<MoEState&>(*c.moe).cache;
    cache.x = Tensor();
    layer_.drop_expert_activations(cache);
  }
  void recompute(FfnCache& c) override {
    auto& cache = static_cast<MoEState&>(*c.moe).cache;
    cache.x = c.x;
    layer_.recompute_expert_activations(cache);
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
      std::copy_n(p->value.data<float>(), p->value.numel(), layer_.router().bias().begin());
  }

 private:
  kernels::Ctx ctx_;
  ep::MoELayer layer_;
  int moe_index_ = 0;
  std::vector<Param*> last_buffers_;
};

}  // namespace

std::unique_ptr<FeedForward> make_moe_ffn(const kernels::Ctx& ctx, const Config& cfg, int layer,
                                          const StageComms& comms, GemmPrecision& precision) {
  return std::make_unique<MoEFeedForward>(ctx, cfg, layer, comms, precision);
}

}  // namespace trident::model
