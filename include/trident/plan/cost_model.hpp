// Cost model: what one rank does for one action of a pipeline schedule (F, B,
// W of one micro-batch through one model chunk) and what it holds in memory,
// in FLOPs and bytes, from the model config and the mesh alone.
//
// The counts follow the code of src/model (share/trident/planner.md writes
// every formula out): T = micro_batch_size * seq_len / cp tokens per rank and
// micro-batch; a multiply-add is 2 FLOPs; floats are 4 bytes.
//  - GEMM, forward: attention projections 2 T d (2 H D + 2 Hkv D), dense FFN
//    6 T d f, MoE router 2 T d E and experts 6 (T k imbalance) d f, LM head
//    2 T d V. B (input gradients) and W (weight gradients) each repeat the
//    forward GEMMs; the zero-bubble split defers only the attention
//    projections' and the head's weight gradients to W (the SwiGLU and MoE
//    kernels produce both gradients in one pass).
//  - Attention core: 4 H D FLOPs per (query, key) pair the causal mask keeps,
//    on the rank with the most pairs (zig-zag: exactly 1/cp of them;
//    contiguous: the last rank); backward 2.5 times forward (P recomputed).
//  - Memory-bound bytes: norms, RoPE, residuals, copies, SwiGLU gating,
//    cross-entropy (counts in planner.md); backward twice forward.
//  - Recompute (train.recompute on the first recompute_layers layers of a
//    chunk): full keeps a layer's input and B reruns its forward (work and
//    exchanges); selective drops the RMSNorm outputs before attention and
//    the FFN and the SwiGLU gate and up (dense: T x f; MoE: the experts'
//    R x fe) and B recomputes them (the norms and the SwiGLU forward, with
//    no exchange). The sharded optimizer keeps AdamW state
//    for the rank's shards only (memory_of_rank).
//  - Communication per action: the CP ring sends cp-1 K/V blocks forward and
//    2cp-1 blocks backward (K/V, the dK/dV accumulators, the last one home
//    after the last step); with cp_mode ulysses/hybrid (Ulysses
//    groups of u, a ring of r = cp/u) the ring moves blocks of T u tokens and
//    n_kv_heads/u (at least 1) heads over r-1 steps, the attention core runs
//    H/u heads over the pairs of ring rank of r, and the all-to-alls send
//    (u-1)/u of q, k, v, out, lse forward and of q, k, v, out, lse, dout, dq,
//    dk, dv backward, not overlapped; the MoE exchange sends (ep-1)/ep of the
//    routed rows out and back (dispatch, combine), forward and backward.
#pragma once
#include <string>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/parallel/pp/schedule.hpp"

namespace trident::plan {

// One candidate: mesh, schedule and the split of the global batch.
struct MeshPlan {
  int pp = 1, vpp = 1, cp = 1, ep = 1, dp = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  CpLayout cp_layout = CpLayout::zigzag;
  int micro_batch_size = 1, microbatches = 1;
  CpMode cp_mode = CpMode::ring;
  int cp_ulysses = 1;  // Ulysses group size: ring 1, ulysses cp, hybrid parallel.cp_ulysses
  // Memory policies (train.recompute, train.recompute_layers, train.optimizer_sharding).
  Recompute recompute = Recompute::none;
  int recompute_layers = 0;  // the first N layers of each chunk; 0: all
  OptimizerSharding sharding = OptimizerSharding::none;
  // Layers per virtual stage (parallel.pp_layout); empty: the even split.
  std::vector<int> pp_layout;
  // train.grad_bucket_mb: > 0, the gradient reduction runs in buckets of about
  // this many MiB, posted during the backward; 0, after the pipeline.
  double grad_bucket_mb = 0;
  // Packed documents: the cp layout's simulated imbalance on this ring
  // (packed_layout_imbalance), set by the search, which prices thousands of
  // candidates on a few rings; 0: simulated where the plan is priced.
  double packed_imbalance = 0;

  long long global_batch() const { return 1LL * micro_batch_size * microbatches * dp; }
  int cp_ring() const { return cp / cp_ulysses; }
  // "pp=2 vpp=1 cp=2 ep=1 dp=2 1f1b zigzag mbs=2 m=4", with " ulysses" or
  // " hybrid u=2" after the layout when cp is not a plain ring, and
  // " recompute=full[:N]", " sharding=dp" after the batch when not none.
  std::string str() const;
};

// Which rank runs each virtual stage under the plan's schedule (the loop
// placement, or the V placement of zb-v and dualpipev).
pp::Placement placement_of(const MeshPlan& plan);

// The config's own mesh on a world of `world` ranks.
MeshPlan mesh_plan_of(const Config& cfg, int world);
// cfg with the plan's parallel and data keys.
Config with_plan(Config cfg, const MeshPlan& plan);

// Work of one action on one rank, by the rate that prices it.
struct Work {
  double gemm_flops = 0;
  double attention_flops = 0;
  double memory_bytes = 0;
  Work& operator+=(const Work& o);
};

// Bytes this rank sends during one action, by parallelism.
struct ActionComm {
  double cp_bytes = 0;       // ring K/V (and dK/dV in B), every block sent
  int cp_steps = 0;          // ring steps whose transfer hides behind a step's attention
  double cp_tail_bytes = 0;  // of cp_bytes, sent after the last step (B: dK/dV home)
  int cp_tail_messages = 0;
  double ep_bytes = 0;   // all-to-all rows out (dispatch + combine)
  int ep_exchanges = 0;  // all-to-all calls
  double a2a_bytes = 0;  // Ulysses all-to-alls of the attention (not overlapped)
  int a2a_calls = 0;
};

// Bytes one micro-batch holds on one virtual stage, by how long it holds them.
struct ChunkMemory {
  double cache = 0;        // from F until its last backward (B; W when backward is split)
  double stash = 0;        // from B until W when split: the weight gradients' inputs
  double transient_f = 0;  // temporaries of an F at its peak
  double transient_b = 0;  // temporaries of a B at its peak, beyond the cache still held
  double freed_early = 0;  // cache a B that runs W at once frees before its peak (the head's)
  ChunkMemory& operator+=(const ChunkMemory& o);
};

// One virtual stage's actions for one micro-batch.
struct ChunkCost {
  int layers = 0, moe_layers = 0;
  int reruns = 0, moe_reruns = 0;    // layers whose forward B runs again (full recompute)
  bool first = false, last = false;  // holds the embedding / the head and loss
  Work f, b, w;                      // b: input gradient (plus what B computes anyway)
  ActionComm f_comm, b_comm;
  double attention_flops_total_f = 0;  // attention FLOPs of all cp ranks (for balance)
  double boundary_bytes = 0;           // hidden states sent to the next stage
  double params = 0;                   // parameters this rank holds for the chunk
  double expert_params = 0;            // of which expert weights (reduced over replicas)
  // Of params, the weights GEMMs read: train.precision = "bf16" keeps a bf16
  // copy of each (model::GemmPrecision), counted with the parameters, or on
  // the native CPU path its packed form instead (MemoryEstimate).
  double gemm_params = 0;
  // Floats beside the parameters, outside the store and the optimizer: each
  // MoE layer's router bias (a buffer the checkpoint saves), its value and
  // the gradient tensor its Param was built with (2 E).
  double buffers = 0;
  // Activation memory: what tensors hold (the device allocator counts it) and
  // what the code keeps in host vectors outside it (the MoE layer's routing,
  // rows and expert activations).
  ChunkMemory tracked, untracked;
  double workspace = 0;  // largest scratch one kernel of the chunk asks the workspace for
  // The native bf16 GEMM's packing buffers (kept per thread, host vectors
  // outside the allocator; bf16 only): cpu-kernels.md#native-bf16.
  double packing = 0;
};

// Expected most-loaded rank's routed rows over the mean (>= 1): with N
// routed copies spread over ep ranks uniformly at random, the maximum is
// about mean + sd * sqrt(2 ln ep) (normal approximation of the multinomial).
double moe_imbalance(double routed_copies, int ep);

// Causal (query, key) pairs of one sequence held by the busiest CP rank.
double causal_pairs_busiest_rank(long long seq_len, int cp, CpLayout layout);
// The same with a sliding window (model.window = W > 0: query i sees at most
// W keys); window 0 is causal_pairs_busiest_rank.
double window_pairs_busiest_rank(long long seq_len, int cp, CpLayout layout, long long window);

ChunkCost chunk_cost(const Config& cfg, const MeshPlan& plan, int virtual_stage);

// Memory of one rank, bytes.
struct MemoryEstimate {
  double params = 0, grads = 0, optimizer = 0;  // fp32 weights, grads, AdamW m and v
  // of params: the GEMM weights' bf16 copies (train.precision bf16; none
  // where the native CPU path packs them: kernels::cpu_bf16_packs_weights)
  double param_copies = 0;
  double buffers = 0;       // of params: the MoE routers' bias buffers (ChunkCost::buffers)
  double activations = 0;   // peak of in-flight caches plus the running action's temporaries
  double comm_buffers = 0;  // ring K/V buffers, MoE send rows (boundary tensors: activations)
  double workspace = 0;     // the kernels' scratch and the gradient-reduction packing buffer
  // The GEMM weights packed for the CPU's native bf16 GEMM in place of the
  // copies (PackedBf16Weight, train.precision bf16 where
  // kernels::cpu_bf16_packs_weights; host vectors, untracked)
  double packed_weights = 0;
  // Of the above, bytes held outside the device allocator (host vectors and
  // buffers that are not tensors): the allocator's peak is total - untracked.
  double untracked = 0;
  double total() const {
    return params + grads + optimizer + activations + comm_buffers + workspace + packed_weights;
  }
  double allocator() const { return total() - untracked; }
};

// Peak bytes of the in-flight activations of one rank over its action list
// in a lowered schedule: at each F, B and W, what the micro-batches between
// their F and their last backward hold plus the action's own temporaries.
double activation_peak(const pp::Schedule& lowered, int rank,
                       const std::vector<ChunkMemory>& per_stage);

// Memory of pipeline rank `pp_rank` under the lowered schedule (the simulator's
// order of actions decides how many micro-batches are in flight).
MemoryEstimate memory_of_rank(const Config& cfg, const MeshPlan& plan, int pp_rank,
                              const pp::Schedule& lowered);
// The same with one micro-batch in flight per chunk: no schedule holds less.
MemoryEstimate memory_lower_bound(const Config& cfg, const MeshPlan& plan, int pp_rank);

}  // namespace trident::plan
