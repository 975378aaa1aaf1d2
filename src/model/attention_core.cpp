// Attention of one sequence on this rank: the local flash-style kernel when
// the sequence is whole here, ring attention over the cp group otherwise.
#include <cmath>
#include <algorithm>
#include <numeric>

#include "trident/core/error.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/model/blocks.hpp"

namespace trident::model {
namespace {

class LocalAttention : public AttentionCore {
 public:
  LocalAttention(int H, int Hkv, int D) : H_(H), Hkv_(Hkv), D_(D) {}
  kernels::AttnShape shape(int64_t Ls) const {
    kernels::AttnShape s;
    s.Tq = s.Tk = Ls;
    s.H = H_;
    s.Hkv = Hkv_;
    s.D = D_;
    s.scale = 1.0f / std::sqrt(float(D_));
    s.causal = true;
    return s;
  }
  void forward(const float* q, const float* k, const float* v, int64_t Ls, float* out,
               float* lse) override {
    kernels::attention_forward(shape(Ls), q, k, v, out, lse);
  }
  void backward(const float* q, const float* k, const float* v, int64_t Ls, const float* out,
                const float* lse, const float* dout, float* dq, float* dk, float* dv) override {
    std::fill_n(dq, Ls * H_ * D_, 0.0f);
    std::fill_n(dk, Ls * Hkv_ * D_, 0.0f);
    std::fill_n(dv, Ls * Hkv_ * D_, 0.0f);
    kernels::attention_backward(shape(Ls), q, k, v, out, lse, dout, dq, dk, dv);
  }

 private:
  int H_, Hkv_, D_;
};

}  // namespace

std::unique_ptr<AttentionCore> make_attention_core(const Config& cfg, const StageComms& comms) {
  const auto& m = cfg.model;
  if (!comms.cp || comms.cp->size() == 1)
    return std::make_unique<LocalAttention>(m.n_heads, m.n_kv_heads, m.head_dim());
  throw Error("context parallelism (cp > 1) needs cp::RingAttention, which is not built yet");
}

std::vector<int64_t> local_positions(const Config& cfg, const StageComms& comms) {
  std::vector<int64_t> pos(size_t(cfg.data.seq_len));
  std::iota(pos.begin(), pos.end(), 0);
  if (!comms.cp || comms.cp->size() == 1) return pos;
  throw Error("context parallelism (cp > 1) needs cp::local_positions, which is not built yet");
}

}  // namespace trident::model
