// AdamW over named parameters, and the learning-rate schedule.
//
// The moments of the parameters (or of the part of them this rank owns,
// with a sharded optimizer: parallel/dp/zero.hpp) lie in one allocation
// each, m and v, in the order of the pieces below. A checkpoint stores them
// per parameter name, so a checkpoint written by one mesh or sharding
// restores into another (each rank takes the names, or the parts, it holds).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/core/param.hpp"
#include "trident/core/param_store.hpp"
#include "trident/kernels/context.hpp"

namespace trident::train {

// Linear warmup over warmup_steps (step 0 gets lr / warmup_steps), then cosine
// decay to lr * min_lr_ratio at the last step. step counts from 0.
double learning_rate(const TrainConfig& t, int64_t step);

class AdamW {
 public:
  // Elements [begin, begin + numel) of param's value, with their moments at
  // `moment` in m() and v().
  struct Piece {
    Param* param = nullptr;
    int64_t begin = 0, numel = 0, moment = 0;
  };
  // Every element of every parameter, in the given order. The updates run as
  // kernels on ctx (default: the host), and the moments live on ctx's
  // device, from its allocator.
  AdamW(std::vector<Param*> params, const TrainConfig& t, const kernels::Ctx& ctx = {});
  // The elements of `store` inside owned[kind] (store offsets), the moments
  // of kind k starting at base[k]: n_moments elements in all. cut[k] > 0:
  // pieces also end at every multiple of cut[k] elements from the start of
  // kind k's range (the shards, dp::Sharding::part), so that an element is
  // updated by a kernel call of the same extent whether this rank owns the
  // whole range or one shard of it.
  AdamW(const ParamStore& store, const std::array<ParamStore::Range, 3>& owned,
        const std::array<int64_t, 3>& base, int64_t n_moments, const TrainConfig& t,
        const kernels::Ctx& ctx = {}, const std::array<int64_t, 3>& cut = {});
  // One update of every piece with gradients multiplied by grad_scale.
  void step(double lr, float grad_scale);
  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }
  const std::vector<Piece>& pieces() const { return pieces_; }
  // Both moments, one allocation each.
  Tensor& m() { return m_; }
  Tensor& v() { return v_; }
  // The moments of one whole parameter (throws when this optimizer holds
  // only part of it).
  Tensor m(const std::string& name) { return whole(m_, name); }
  Tensor v(const std::string& name) { return whole(v_, name); }

 private:
  Tensor whole(const Tensor& buf, const std::string& name) const;

  kernels::Ctx ctx_;
  std::vector<Piece> pieces_;
  TrainConfig cfg_;
  int64_t t_ = 0;
  Tensor m_, v_;
};

}  // namespace trident::train
