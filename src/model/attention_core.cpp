// Attention of one sequence on this rank: the local flash-style kernel when
// the sequence is whole here, ring attention over the cp group otherwise.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "trident/comm/comm.hpp"
#include "trident/core/error.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/ops.hpp"
#include "trident/model/blocks.hpp"
#include "trident/parallel/cp/config_rules.hpp"
#include "trident/parallel/cp/ring_attention.hpp"
#include "trident/parallel/cp/ulysses_attention.hpp"

namespace trident::model {
namespace {

void record(AttentionCore& core, double t_begin, double compute_s, bool backward) {
  if (core.spans) core.spans->push_back(AttnSpan{t_begin, compute_s, core.layer, backward});
}

class LocalAttention : public AttentionCore {
 public:
  LocalAttention(const kernels::Ctx& ctx, int H, int Hkv, int D)
      : ctx_(ctx), H_(H), Hkv_(Hkv), D_(D) {}
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
    const double t0 = now_s();
    kernels::attention_forward(ctx_, shape(Ls), q, k, v, out, lse);
    record(*this, t0, now_s() - t0, false);
  }
  void backward(const float* q, const float* k, const float* v, int64_t Ls, const float* out,
                const float* lse, const float* dout, float* dq, float* dk, float* dv) override {
    const double t0 = now_s();
    kernels::fill(ctx_, dq, Ls * H_ * D_, 0.0f);
    kernels::fill(ctx_, dk, Ls * Hkv_ * D_, 0.0f);
    kernels::fill(ctx_, dv, Ls * Hkv_ * D_, 0.0f);
    kernels::attention_backward(ctx_, shape(Ls), q, k, v, out, lse, dout, dq, dk, dv);
    record(*this, t0, now_s() - t0, true);
  }

 private:
  kernels::Ctx ctx_;
  int H_, Hkv_, D_;
};

// The sequence is split over the cp group: the ring passes K/V around it.
class RingAttentionCore : public AttentionCore {
 public:
  RingAttentionCore(const kernels::Ctx& ctx, const Config& cfg, Communicator* cp)
      : ring_(cp, cfg.parallel.cp_layout, true, cfg.data.seq_len, ctx),
        H_(cfg.model.n_heads),
        Hkv_(cfg.model.n_kv_heads),
        D_(cfg.model.head_dim()) {
    ring_.set_profiler(&work_);
  }
  void forward(const float* q, const float* k, const float* v, int64_t, float* out,
               float* lse) override {
    work_.clear();
    const double t0 = now_s();
    ring_.forward(q, k, v, H_, Hkv_, D_, out, lse);
    record(*this, t0, work_.seconds("ring.forward"), false);
  }
  void backward(const float* q, const float* k, const float* v, int64_t, const float* out,
                const float* lse, const float* dout, float* dq, float* dk, float* dv) override {
    work_.clear();
    const double t0 = now_s();
    ring_.backward(q, k, v, out, lse, dout, H_, Hkv_, D_, dq, dk, dv);
    record(*this, t0, work_.seconds("ring.backward"), true);
  }

 private:
  prof::Recorder work_{false};  // the ring's kernel time of the current call
  cp::RingAttention ring_;
  int H_, Hkv_, D_;
};

// cp_mode ulysses / hybrid: all-to-all inside the Ulysses group, then the
// ring (cp/ulysses_attention.hpp).
class UlyssesAttentionCore : public AttentionCore {
 public:
  UlyssesAttentionCore(const kernels::Ctx& ctx, const Config& cfg, Communicator* cp)
      : ulysses_(cp, cp::ulysses_size(cfg.parallel), cfg.parallel.cp_layout, true, cfg.data.seq_len,
                 cfg.model.n_heads, cfg.model.n_kv_heads, cfg.model.head_dim(), ctx) {
    ulysses_.set_profiler(&work_);
  }
  void forward(const float* q, const float* k, const float* v, int64_t, float* out,
               float* lse) override {
    work_.clear();
    const double t0 = now_s();
    ulysses_.forward(q, k, v, out, lse);
    record(*this, t0, work_.seconds("ring.forward"), false);
  }
  void backward(const float* q, const float* k, const float* v, int64_t, const float* out,
                const float* lse, const float* dout, float* dq, float* dk, float* dv) override {
    work_.clear();
    const double t0 = now_s();
    ulysses_.backward(q, k, v, out, lse, dout, dq, dk, dv);
    record(*this, t0, work_.seconds("ring.backward"), true);
  }

 private:
  prof::Recorder work_{false};
  cp::UlyssesAttention ulysses_;
};

}  // namespace

std::unique_ptr<AttentionCore> make_attention_core(const kernels::Ctx& ctx, const Config& cfg,
                                                   const StageComms& comms) {
  const auto& m = cfg.model;
  if (!comms.cp || comms.cp->size() == 1)
    return std::make_unique<LocalAttention>(ctx, m.n_heads, m.n_kv_heads, m.head_dim());
  if (cp::ulysses_size(cfg.parallel) > 1)
    return std::make_unique<UlyssesAttentionCore>(ctx, cfg, comms.cp);
  return std::make_unique<RingAttentionCore>(ctx, cfg, comms.cp);
}

std::vector<int64_t> local_positions(const Config& cfg, const StageComms& comms) {
  std::vector<int64_t> pos(size_t(cfg.data.seq_len));
  std::iota(pos.begin(), pos.end(), 0);
  if (!comms.cp || comms.cp->size() == 1) return pos;
  const auto layout = cfg.parallel.cp_layout;
  cp::check_layout(cfg.data.seq_len, comms.cp->size(), layout);
  return cp::local_positions(cfg.data.seq_len, comms.cp->size(), comms.cp->rank(), layout,
                             cp::ulysses_size(cfg.parallel));
}

}  // namespace trident::model
