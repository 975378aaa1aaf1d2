// MoELayer: router + experts (SwiGLU MLPs) with expert parallelism.
//
// Forward: logits = x·W_routerᵀ -> Router (top-k, aux/z losses, capacity) ->
// TokenDispatcher (count exchange, expert-major permutation, transfer to the
// expert ranks) -> each local expert runs its SwiGLU on its rows (one
// contiguous block per expert) -> transfer back -> weighted un-permute in
// token order. Backward runs the same steps in reverse. The residual is the
// caller's.
//
// Parameters, stored [out, in]: "layers.<L>.moe.router" [E, d]
// (GradReduce::dense) and, for each local expert g,
// "layers.<L>.moe.experts.<g>.w_gate|w_up" [f, d] and ".w_down" [d, f]
// (GradReduce::expert). All are initialised from the counter RNG by name
// (keyed in [in, out] order, see core/param.hpp), so any ep holds the
// values ep = 1 has. The sigmoid_bias router's bias is state, not a
// parameter: buffers() gives it (as a Param with GradReduce::none) for
// checkpoints.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"
#include "trident/core/param.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/types/gemm_bf16.hpp"
#include "trident/parallel/ep/router.hpp"
#include "trident/parallel/ep/token_dispatcher.hpp"

namespace trident::ep {

// One forward of one MoE layer on this rank.
struct MoEStats {
  double aux_loss_sum = 0;  // this rank's share of sum over samples of L_s (see Router)
  double z_loss_sum = 0;    // same for the z-loss
  std::vector<int64_t>
      tokens_per_expert;  // [E] global expert ids: copies of this rank's tokens kept
  int64_t dropped = 0;    // copies dropped by capacity

  // max/mean of tokens_per_expert (1 = balanced; 0 when nothing was routed).
  double imbalance() const;
};

// The experts' computation on each row block they receive: the layer's
// SwiGLU experts (functional.hpp's swiglu_*) unless set_expert_fn names
// another. The tensors are views of one block of the expert side, on the
// layer's device: x, y, dy, dx [rows, d]; gate, up [rows, f] (forward
// writes y, gate and up; backward writes dx and accumulates the weight
// gradients).
struct ExpertBlockFn {
  virtual ~ExpertBlockFn() = default;
  virtual void forward(int local_expert, const Tensor& x, const Tensor& y, const Tensor& gate,
                       const Tensor& up) = 0;
  virtual void backward(int local_expert, const Tensor& x, const Tensor& gate, const Tensor& up,
                        const Tensor& dy, const Tensor& dx) = 0;
};

class MoELayer {
 public:
  // ep: nullptr or size 1 keeps every expert local. cp: shares the samples
  // for the aux statistics; nullptr when every sample is whole on this rank.
  // transport: runtime.ep_transport; see TokenDispatcher. ctx: where the
  // kernels run. Collective over ep.
  MoELayer(const ModelConfig& cfg, int layer_index, Communicator* ep, Communicator* cp,
           EpTransportChoice transport = EpTransportChoice::automatic, double shm_limit_bytes = 0,
           const kernels::Ctx& ctx = {});
  ~MoELayer();
  MoELayer(const MoELayer&) = delete;  // its experts point back at it
  MoELayer& operator=(const MoELayer&) = delete;

  std::vector<Param*> params();   // router, then local experts (gate, up, down each)
  std::vector<Param*> buffers();  // router bias (sigmoid_bias only), GradReduce::none

  struct Cache {
    int n_samples = 0;
    // [T, d]: forward's input, a handle on the caller's tensor, not a copy
    // (as the dense FFN keeps its own); the caller keeps its elements
    // unchanged until backward (and borrowed memory alive).
    Tensor x;
    Routing routing;  // routing.logits: router_logits [T, E] for activation capture
    DispatchPlan plan;
    std::unique_ptr<ForwardRows> rows;  // expert side: inputs and outputs [R, d] each
    Tensor expert_x;  // expert side: the experts' inputs [R, d], rows->in() or its bf16 copy
    Tensor gate, up;  // expert side: [R, f] each, of the experts' activation dtype
    const Tensor& router_logits() const { return routing.logits; }  // on the layer's device
  };

  // x, y: f32 [T, d] on the layer's device (T = numel / d; a caller with
  // raw buffers wraps them with Tensor::borrow); sample_of_token i32 [T] in
  // [0, n_samples). The cache refers to x until backward (see Cache::x). y
  // is overwritten with the expert mixture. token_index i64 [T]: each
  // token's index in the micro-batch that the cp group shares, as one rank
  // holds it (see Router::route); nullptr: t.
  void forward(const Tensor& x, const Tensor& sample_of_token, int n_samples, const Tensor& y,
               Cache& cache, MoEStats& stats, const Tensor* token_index = nullptr);
  // The same with the index data on the host (tests and benchmarks):
  // uploaded to the layer's device first.
  void forward(const Tensor& x, const std::vector<int>& sample_of_token, int n_samples,
               const Tensor& y, Cache& cache, MoEStats& stats,
               const std::vector<int64_t>* token_index = nullptr);
  // dy [T, d] -> dx [T, d] (overwritten); gradients ACCUMULATE into the
  // params. daux_scale: d(total loss) / d(aux_loss_sum + z_loss_sum).
  void backward(const Tensor& dy, const Tensor& dx, Cache& cache, float daux_scale);
  // Selective recompute: release the experts' gate and up activations
  // ([R, f] each) after the forward, and compute them again before the
  // backward by running the experts on the kept expert-side rows (the same
  // kernels on the same rows: the same bits; no exchange).
  void drop_expert_activations(Cache& cache);
  void recompute_expert_activations(Cache& cache);
  // sigmoid_bias only: load = copies per expert over the global batch.
  void update_bias(const std::vector<int64_t>& global_load);

  int n_experts() const { return E_; }
  int local_experts() const { return L_; }
  int first_local_expert() const { return first_; }
  Router& router() { return router_; }
  const TokenDispatcher& dispatcher() const { return dispatcher_; }
  TokenDispatcher& dispatcher() { return dispatcher_; }
  Param& router_weight() { return router_w_; }
  Param& expert_param(int local_expert, int which);  // which: 0 gate, 1 up, 2 down
  // Replaces the SwiGLU experts (nullptr: back to SwiGLU). Not owned.
  void set_expert_fn(ExpertBlockFn* fn) { expert_fn_ = fn ? fn : swiglu_.get(); }
  // What the SwiGLU experts' GEMMs read for an expert weight: under
  // train.precision = "bf16" the model's bf16 copy of it, or its master with
  // its packed form (model/blocks.hpp, GemmPrecision, which keeps them
  // current), so that the op table's bf16 rows run them; unset: the fp32
  // value and no packed form. Masters and weight gradients stay fp32.
  using GemmWeightFn = std::function<const Tensor&(const Param&)>;
  using PackedWeightFn = std::function<const kernels::PackedBf16Weight*(const Param&)>;
  void set_gemm_weights(GemmWeightFn fn, PackedWeightFn packed = {}) {
    gemm_weight_ = std::move(fn);
    packed_weight_ = std::move(packed);
  }
  const Tensor& expert_gemm_weight(int local_expert, int which);
  // The dtype of what the SwiGLU experts read and keep: their input rows
  // (rounded once as they arrive on the expert side, the rounding the bf16
  // GEMMs would apply as they pack them) and their saved gate and up
  // activations. f32 (the default) or, under train.precision = "bf16",
  // bf16 as the dense FFN's activations (model/blocks.hpp, GemmPrecision).
  // The router, the exchanges and the combine stay f32.
  void set_expert_activations(DType dtype);
  // The packed forms of an expert's three weights (the SwiGLU's operand).
  kernels::SwigluPacked expert_packed_weights(int local_expert);

 private:
  // The experts on each (source, expert) chunk of the expert side [R, d].
  void run_experts_forward(Cache& c, const Tensor& out);
  void run_experts_backward(Cache& c, const Tensor& dout, const Tensor& din);
  Tensor expert_inputs(const Tensor& rows) const;
  void dispatch_inputs(Cache& c);

  kernels::Ctx ctx_;
  int d_, f_, E_, k_, L_, first_;
  Router router_;
  TokenDispatcher dispatcher_;
  Communicator* cp_;
  Param router_w_;
  Param bias_;
  std::vector<Param> experts_;             // [L * 3]
  std::unique_ptr<ExpertBlockFn> swiglu_;  // the SwiGLU experts over experts_
  ExpertBlockFn* expert_fn_;               // what runs: swiglu_ or set_expert_fn's
  GemmWeightFn gemm_weight_;               // set_gemm_weights's, or empty
  PackedWeightFn packed_weight_;           // set_gemm_weights's, or empty
  DType act_ = DType::f32;                 // set_expert_activations's
};

}  // namespace trident::ep
