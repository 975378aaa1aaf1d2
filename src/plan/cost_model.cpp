// Cost model: FLOPs, bytes and memory of one rank's actions, counted from
// the model's code (see cost_model.hpp and share/trident/planner.md).
#include "trident/plan/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/kernels/types/attention.hpp"
#include "trident/kernels/types/gemm_bf16.hpp"
#include "trident/model/transformer.hpp"
#include "trident/parallel/cp/config_rules.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/plan/packed_attention.hpp"

namespace trident::plan {
namespace {

constexpr double kFloat = 4;           // bytes per fp32 value
constexpr double kIndex = 4;           // bytes per int32 routing entry
constexpr double kAttnBackward = 2.5;  // attention backward / forward FLOPs (P recomputed)

// Shapes of one micro-batch on one rank.
struct Shapes {
  double T, d, H, Hkv, D, f, fe, E, k, V, mbs, R;  // fe: each expert's hidden size
  bool shm;       // the MoE exchange goes through the node's shared-memory slots
  bool ep_local;  // ep = 1: the expert side is the send order (the row gradients not copied)
  bool bf16;      // train.precision = "bf16"
  // bytes per value of the activations a GEMM reads (model::GemmPrecision::
  // activation: bf16 tensors under bf16; the rest of the step's stay fp32)
  double act;
  Shapes(const Config& cfg, const MeshPlan& p)
      : bf16(cfg.train.precision == Precision::bf16), act(bf16 ? 2 : kFloat) {
    const ModelConfig& m = cfg.model;
    mbs = p.micro_batch_size;
    T = mbs * double(cfg.data.seq_len) / p.cp;
    d = m.d_model;
    H = m.n_heads;
    Hkv = m.n_kv_heads;
    D = m.head_dim();
    f = m.ffn_hidden;
    fe = m.expert_ffn_hidden();
    E = m.n_experts;
    k = m.top_k;
    V = m.vocab_size;
    // expert-side rows of the busiest rank: the ep ranks' T k copies over ep ranks
    R = E > 0 ? T * k * moe_imbalance(T * k * p.ep, p.ep) : 0;
    // ep lies inside a node, where the automatic choice is the shm transport
    shm = p.ep > 1 && cfg.runtime.ep_transport != EpTransportChoice::alltoallv;
    ep_local = p.ep <= 1;
  }
};

// Attention block: the cache x (its input, shared with whoever made it), h1,
// rstd, q, k, v, o, lse; a split backward keeps o, h1, the incoming gradient
// and dq, dk, dv for W. h1, q, k, v and o are the GEMMs' activations (bf16
// under bf16: s.act); x, rstd, lse and the gradients stay fp32.
void add_attention_layer(const Shapes& s, double pairs, ChunkCost& c) {
  const double proj = 2 * s.T * s.d * (2 * s.H * s.D + 2 * s.Hkv * s.D);
  const double core = s.mbs * pairs * 4 * s.H * s.D;
  const double mem = kFloat * (7 * s.T * s.d + 2 * s.T * (s.H + s.Hkv) * s.D);
  c.f += Work{proj, core, mem};
  c.b += Work{proj, kAttnBackward * core, 2 * mem};
  c.w += Work{proj, 0, 0};
  const double qkv = 2 * s.T * s.H * s.D + 2 * s.T * s.Hkv * s.D;  // q, o and k, v (or grads)
  const double o = s.T * s.H * s.D;
  c.tracked.cache += kFloat * (s.T * s.d + s.T + s.T * s.H) + s.act * (s.T * s.d + qkv);
  c.tracked.stash += kFloat * (s.T * s.d + qkv - o) + s.act * (s.T * s.d + o);
}

// What one layer holds between its F and its B, by phase of its backward
// (the inputs of add_transients), after train.recompute has dropped its part.
struct LayerHold {
  double kept = 0, untracked_kept = 0;     // cache kept from F to B
  double attn_refill = 0, ffn_refill = 0;  // re-created at the start of its B
  double untracked_refill = 0;
  double ffn_kept = 0;          // the FFN block's kept cache (freed before the attention's B)
  double moe_f = 0, moe_b = 0;  // the MoE phase's temporaries
  bool reruns_forward = false;  // full: the forward runs again (its discarded output)
};

// train.recompute on one layer (share/trident/memory.md): full keeps the
// attention block's input x alone and reruns the layer's forward at the start
// of its B (work, ring and MoE exchanges again); selective drops the RMSNorm
// outputs before the attention projections and the FFN and the SwiGLU gate
// and up activations (dense: T x f each; MoE: the experts' R x f each), and
// recomputes them: the norms and the SwiGLU forward (its three GEMMs: the
// fused kernel makes its output too, discarded) on the kept rows.
LayerHold recompute_layer(const Shapes& s, Recompute mode, bool moe, const ChunkCost& layer,
                          double attn_cache, ChunkCost& c) {
  LayerHold h;
  const double Td = kFloat * s.T * s.d, ffn_cache = layer.tracked.cache - attn_cache;
  h.kept = layer.tracked.cache, h.untracked_kept = layer.untracked.cache;
  h.ffn_kept = ffn_cache;
  h.moe_f = layer.tracked.transient_f, h.moe_b = layer.tracked.transient_b;
  if (mode == Recompute::full) {
    h.kept = Td;
    h.attn_refill = attn_cache - Td, h.ffn_refill = ffn_cache;
    h.untracked_kept = 0, h.untracked_refill = layer.untracked.cache;
    h.ffn_kept = 0;
    h.reruns_forward = true;
    c.b += layer.f;
  } else if (mode == Recompute::selective) {
    // the SwiGLU's rows and hidden size: the experts' (R, fe) or the tokens' (T, f)
    // h1, and the FFN's h with gate and up: bf16 under bf16 (s.act) but for
    // the MoE layer's h, which stays fp32 (its experts' gate and up are bf16)
    const double rows = moe ? s.R : s.T, f = moe ? s.fe : s.f;
    const double h_act = moe ? kFloat : s.act;
    h.attn_refill = s.act * s.T * s.d;
    h.ffn_refill = h_act * s.T * s.d + s.act * 2 * rows * f;
    h.kept -= h.attn_refill + h.ffn_refill;
    h.ffn_kept -= h.ffn_refill;
    c.b.memory_bytes += 2 * 2 * Td;  // the norms: read x, write the output
    c.b += Work{6 * rows * s.d * f, 0, kFloat * (3 * rows * f + 2 * rows * s.d)};
  }
  return h;
}

// The widest FFN GEMM output of the model: the dense hidden size, the experts'.
double moe_ffn_width(const Config& cfg, const Shapes& s) {
  return cfg.model.n_experts > 0 ? std::max(s.f, s.fe) : s.f;
}

// The native bf16 GEMM's buffers after the chunk's GEMMs (bf16 only): op(B)
// at most as wide as a layer's projections and FFN or the head; bf16 q, k,
// v and dout made past one K block (K = d > 512) go through an f32 result.
double packing_bytes(const Config& cfg, const Shapes& s, bool last) {
  if (!s.bf16) return 0;
  const double n = std::max({s.d, s.H * s.D, moe_ffn_width(cfg, s), last ? s.V : 0.0});
  const double wide = s.d > 512 ? s.T * s.H * s.D : 0.0;
  return double(kernels::gemm_bf16_buffer_bytes(int64_t(n), int64_t(wide)));
}

// The SwiGLU's largest scratch, in rows x hidden floats: fp32, the
// backward's h and dh; bf16 (swiglu_bf16.cpp), the forward's gate and up in
// f32 and h in bf16 (the backward: dh in f32, h or d(gate) and d(up) in bf16).
double swiglu_scratch(const Shapes& s) { return s.bf16 ? 2.5 : 2; }

// FFN block: x (the attention's output), h, rstd, then the dense SwiGLU's
// gate and up, or the MoE layer's cache (routing, plan, expert-side rows and
// gate/up; its input is the block's h). The dense FFN's h, gate and up are
// bf16 under bf16 (s.act); the MoE layer's h and exchanged rows are fp32
// (ep::MoELayer takes f32 rows), its experts' gate and up bf16, and under
// bf16 it keeps a bf16 copy of the expert side's input rows
// (MoELayer::set_expert_activations).
void add_ffn_layer(const Shapes& s, bool moe, ChunkCost& c) {
  double gemm, mem = kFloat * 7 * s.T * s.d;
  c.tracked.cache += kFloat * (s.T * s.d + s.T) + (moe ? kFloat : s.act) * s.T * s.d;
  if (moe) {
    gemm = 2 * s.T * s.d * s.E + 6 * s.R * s.d * s.fe;
    mem += kFloat * (2 * s.T * s.E + 4 * s.T * s.k * s.d + 3 * s.R * s.fe);
    // tensors: gate/up, the expert side's rows in and out (in the node's
    // shared slots with shm, outside the allocator, which keeps a tensor of
    // the rows gathered back instead), the routing (logits, probabilities,
    // lse; chosen, expert and weight of each copy) and the dispatch plan's
    // row_of and send_token (i64); the input is the block's h, already counted
    const double in_out = kFloat * 2 * s.R * s.d, kept = kFloat * s.T * s.k * s.d;
    const double bf16_in = s.bf16 ? s.act * s.R * s.d : 0.0;
    c.tracked.cache += s.act * 2 * s.R * s.fe + bf16_in + (s.shm ? kept : in_out) +
                       kFloat * (2 * s.T * s.E + s.T) + kIndex * 3 * s.T * s.k + 8 * 2 * s.T * s.k;
    c.untracked.cache += s.shm ? in_out : 0;
    // the MoE phase's temporaries (add_transients adds the block's): forward
    // the router logits; backward the row and weight gradients (the expert
    // side's own copy of the rows' unless ep = 1) and dlogits
    const double expert_side = s.ep_local ? 1 : 2;
    c.tracked.transient_f = std::max(c.tracked.transient_f, kFloat * s.T * s.E);
    c.tracked.transient_b =
        std::max(c.tracked.transient_b,
                 kFloat * (s.T * s.k * s.d + s.T * s.k + expert_side * s.R * s.d + s.T * s.E));
    // one expert's rows from one source rank through the SwiGLU backward
    const double rows = s.T * s.k / s.E * moe_imbalance(s.T * s.k, int(s.E));
    c.workspace = std::max(c.workspace, kFloat * swiglu_scratch(s) * rows * s.fe);
  } else {
    gemm = 6 * s.T * s.d * s.f;
    mem += kFloat * 3 * s.T * s.f;
    c.tracked.cache += s.act * 2 * s.T * s.f;
    c.workspace = std::max(c.workspace, kFloat * swiglu_scratch(s) * s.T * s.f);
  }
  // The SwiGLU and MoE kernels compute input and weight gradients in one
  // pass, so B carries both whether or not the schedule splits backward.
  c.f += Work{gemm, 0, mem};
  c.b += Work{2 * gemm, 0, 2 * mem};
}

// Temporaries of the chunk's F and B beyond its cache (every block writes a
// new tensor; caches share them). F: the head's logits, and the layer's
// dropped part (recompute) until its F ends. B, per layer from the last: the
// cache of the layers below it is still held, the layers above are freed;
// what the recompute re-creates; then by phase the FFN's incoming gradient,
// dx and dh (plus the MoE backward's), or the attention's dy, dh1, dout, dq,
// dk, dv (its layer's FFN cache is freed by then), or the rerun forward's
// discarded output; the head's dh and dy; and from the second stage on the
// gradient sent back, allocated when B starts. Both: the pipeline executor
// posts the receives of the next two actions ahead (an input unless first, a
// gradient unless last).
void add_transients(const Shapes& s, const std::vector<LayerHold>& layers, ChunkCost& c) {
  const double Td = kFloat * s.T * s.d;
  const double ahead = Td * ((c.first ? 0 : 1) + (c.last ? 0 : 1));
  const double dqkv = kFloat * (2 * s.T * s.H * s.D + 2 * s.T * s.Hkv * s.D);
  double total = 0;
  for (const LayerHold& h : layers) total += h.kept;
  double prefix = 0, f_peak = 0, b_peak = 0, refill_untracked = 0;
  for (const LayerHold& h : layers) {
    prefix += h.kept;
    const double below = prefix - total;  // <= 0: the layers above are not held
    const double refill = h.attn_refill + h.ffn_refill;
    f_peak = std::max(f_peak, below + refill + h.moe_f);
    const double ffn_phase = refill + 3 * Td + h.moe_b;
    // dy, dh1, dx and dout (a GEMM's activation: bf16 under bf16)
    const double attn_phase = h.attn_refill - h.ffn_kept + (3 + s.act / kFloat) * Td + dqkv;
    const double rerun = h.reruns_forward ? refill + Td + h.moe_f : 0;
    b_peak = std::max(b_peak, below + std::max({ffn_phase, attn_phase, rerun}));
    refill_untracked = std::max(refill_untracked, h.untracked_refill);
  }
  c.tracked.transient_f = ahead + std::max(f_peak, c.last ? kFloat * s.T * s.V : 0);
  c.tracked.transient_b = ahead + (c.first ? 0 : Td) + std::max(b_peak, c.last ? 2 * Td : 0);
  c.untracked.transient_f = c.untracked.transient_b = refill_untracked;
}

}  // namespace

std::string MeshPlan::str() const {
  std::ostringstream o;
  o << "pp=" << pp << " vpp=" << vpp << " cp=" << cp << " ep=" << ep << " dp=" << dp << " "
    << config_name(schedule) << " " << config_name(cp_layout);
  if (cp_mode == CpMode::ulysses) o << " ulysses";
  if (cp_mode == CpMode::hybrid) o << " hybrid u=" << cp_ulysses;
  o << " mbs=" << micro_batch_size << " m=" << microbatches;
  if (recompute != Recompute::none) {
    o << " recompute=" << config_name(recompute);
    if (recompute_layers > 0) o << ":" << recompute_layers;
  }
  if (sharding != OptimizerSharding::none) o << " sharding=" << config_name(sharding);
  if (!pp_layout.empty()) {
    o << " layout=";
    for (size_t i = 0; i < pp_layout.size(); ++i) o << (i ? "," : "") << pp_layout[i];
  }
  return o.str();
}

pp::Placement placement_of(const MeshPlan& p) {
  return pp::schedule_placement(p.schedule, p.pp, p.vpp);
}

MeshPlan mesh_plan_of(const Config& cfg, int world) {
  MeshPlan p;
  p.pp = cfg.parallel.pp;
  p.vpp = cfg.parallel.vpp;
  p.cp = cfg.parallel.cp;
  p.ep = cfg.parallel.ep;
  p.dp = world / (p.pp * p.cp);
  p.schedule = cfg.parallel.schedule;
  p.cp_layout = cfg.parallel.cp_layout;
  p.cp_mode = cfg.parallel.cp_mode;
  p.cp_ulysses = cp::ulysses_size(cfg.parallel);
  p.micro_batch_size = cfg.data.micro_batch_size;
  p.microbatches = cfg.data.num_microbatches;
  p.recompute = cfg.train.recompute;
  p.recompute_layers = cfg.train.recompute_layers;
  p.sharding = cfg.train.optimizer_sharding;
  p.pp_layout = cfg.parallel.pp_layout;
  p.grad_bucket_mb = cfg.train.grad_bucket_mb;
  return p;
}

Config with_plan(Config cfg, const MeshPlan& p) {
  cfg.parallel.pp = p.pp;
  cfg.parallel.vpp = p.vpp;
  cfg.parallel.cp = p.cp;
  cfg.parallel.ep = p.ep;
  cfg.parallel.schedule = p.schedule;
  cfg.parallel.cp_layout = p.cp_layout;
  cfg.parallel.cp_mode = p.cp_mode;
  cfg.parallel.cp_ulysses = p.cp_mode == CpMode::hybrid ? p.cp_ulysses : 0;
  cfg.data.micro_batch_size = p.micro_batch_size;
  cfg.data.num_microbatches = p.microbatches;
  cfg.train.recompute = p.recompute;
  cfg.train.recompute_layers = p.recompute_layers;
  cfg.train.optimizer_sharding = p.sharding;
  cfg.parallel.pp_layout = p.pp_layout;
  cfg.train.grad_bucket_mb = p.grad_bucket_mb;
  return cfg;
}

ChunkMemory& ChunkMemory::operator+=(const ChunkMemory& o) {
  cache += o.cache;
  stash += o.stash;
  transient_f += o.transient_f;
  transient_b += o.transient_b;
  freed_early += o.freed_early;
  return *this;
}

Work& Work::operator+=(const Work& o) {
  gemm_flops += o.gemm_flops;
  attention_flops += o.attention_flops;
  memory_bytes += o.memory_bytes;
  return *this;
}

double moe_imbalance(double routed_copies, int ep) {
  if (ep <= 1 || routed_copies <= 0) return 1.0;
  const double p = 1.0 / ep, mean = routed_copies * p;
  const double sd = std::sqrt(routed_copies * p * (1 - p));
  return (mean + sd * std::sqrt(2 * std::log(double(ep)))) / mean;
}

double causal_pairs_busiest_rank(long long seq_len, int cp, CpLayout layout) {
  const double S = double(seq_len);
  if (cp <= 1) return S * (S + 1) / 2;
  if (layout == CpLayout::zigzag) {
    // rank r holds chunks r and 2cp-1-r of size c: (2cp-1) c^2 + c(c+1) pairs, 1/cp of all
    const double c = S / (2.0 * cp);
    return 2 * cp * c * c + c;
  }
  const double c = S / cp;  // the last rank sees every earlier chunk
  return (cp - 1) * c * c + c * (c + 1) / 2;
}

double window_pairs_busiest_rank(long long seq_len, int cp, CpLayout layout, long long window) {
  if (window <= 0 || window >= seq_len) return causal_pairs_busiest_rank(seq_len, cp, layout);
  const double S = double(seq_len), W = double(window);
  // Pairs of the queries [0, n): sum over i < n of min(i + 1, W).
  auto upto = [W](double n) { return n <= W ? n * (n + 1) / 2 : W * (W + 1) / 2 + (n - W) * W; };
  auto chunk = [&](double a, double len) { return upto(a + len) - upto(a); };
  double busiest = 0;
  for (int r = 0; r < cp; ++r) {
    double pairs;
    if (layout == CpLayout::zigzag && cp > 1) {
      const double c = S / (2.0 * cp);
      pairs = chunk(r * c, c) + chunk((2.0 * cp - 1 - r) * c, c);
    } else {
      const double c = S / cp;
      pairs = chunk(r * c, c);
    }
    busiest = std::max(busiest, pairs);
  }
  return busiest;
}

namespace {

// The CP communication of one action: the ring's K/V (and dK/dV) blocks and
// the Ulysses all-to-alls (planner.md, "Context-parallel modes").
void add_cp_comm(const Shapes& s, const MeshPlan& p, ChunkCost& c) {
  const int u = p.cp_ulysses, r = p.cp_ring();
  const double hkv_u =
      u > 1 ? std::max(1.0, s.Hkv / u) : s.Hkv;  // K/V heads per rank after the all-to-all
  if (r > 1) {
    // per layer and sample: K and V of the group's u Ls tokens (Ls = T/mbs).
    // F: r-1 ring steps of one block, each behind a step's attention. B:
    // the same K/V steps with the dK/dV accumulator of the step before in
    // flight (2 blocks per step), then the last accumulator's trip home,
    // after the last step's compute (nothing to hide it): 2r-1 blocks.
    const double kv = kFloat * 2 * u * (s.T / s.mbs) * hkv_u * s.D;
    const int samples = c.layers * int(s.mbs);
    c.f_comm.cp_bytes = samples * (r - 1) * kv;
    c.f_comm.cp_steps = samples * (r - 1);
    c.b_comm.cp_steps = c.f_comm.cp_steps;
    c.b_comm.cp_tail_bytes = samples * kv;
    c.b_comm.cp_tail_messages = samples;
    c.b_comm.cp_bytes = samples * (2 * r - 1) * kv;
    // a rerun forward (full recompute) sends its K/V blocks again
    const int rerun = c.reruns * int(s.mbs);
    c.b_comm.cp_bytes += rerun * (r - 1) * kv;
    c.b_comm.cp_steps += rerun * (r - 1);
  }
  if (u > 1) {
    // per layer and sample, (u-1)/u of each tensor leaves the rank: q and out
    // [Ls, H, D], k and v [Ls, u hkv_u, D], lse [Ls, H]
    const double Ls = s.T / s.mbs, share = double(u - 1) / u;
    const double q = kFloat * Ls * s.H * s.D, kv = kFloat * Ls * u * hkv_u * s.D,
                 lse = kFloat * Ls * s.H;
    const double f_bytes = s.mbs * share * (2 * q + 2 * kv + lse);
    c.f_comm.a2a_bytes = c.layers * f_bytes;
    c.f_comm.a2a_calls = c.layers * int(s.mbs) * 5;
    c.b_comm.a2a_bytes = c.layers * s.mbs * share * (4 * q + 4 * kv + lse) + c.reruns * f_bytes;
    c.b_comm.a2a_calls = (c.layers * 9 + c.reruns * 5) * int(s.mbs);
  }
}

// The chunk's layers [begin, end): work, caches and parameters, with the
// plan's recompute on its first recompute_layers layers.
std::vector<LayerHold> add_layers(const Config& cfg, const MeshPlan& p, const Shapes& s,
                                  double pairs, int begin, int end, ChunkCost& c) {
  const double attn_params = 2 * s.d + 2 * s.H * s.D * s.d + 2 * s.Hkv * s.D * s.d +
                             (cfg.model.qk_norm ? 2 * s.D : 0);  // + 2 norms (+ q/k norms)
  std::vector<LayerHold> holds;
  const Recompute mode = p.recompute;
  for (int l = begin; l < end; ++l) {
    const bool moe = cfg.model.is_moe_layer(l);
    ChunkCost layer;
    add_attention_layer(s, pairs, layer);
    const double attn_cache = layer.tracked.cache;
    add_ffn_layer(s, moe, layer);
    const int i = l - begin;
    const bool recomputed =
        mode != Recompute::none && (p.recompute_layers == 0 || i < p.recompute_layers);
    holds.push_back(
        recompute_layer(s, recomputed ? mode : Recompute::none, moe, layer, attn_cache, c));
    c.f += layer.f;
    c.b += layer.b;
    c.w += layer.w;
    c.tracked.stash += layer.tracked.stash;
    c.tracked.cache += holds.back().kept;
    c.untracked.cache += holds.back().untracked_kept;
    c.workspace = std::max(c.workspace, layer.workspace);
    if (recomputed && mode == Recompute::full) {
      c.reruns += 1;
      c.moe_reruns += moe ? 1 : 0;
    }
    c.params += attn_params;
    c.gemm_params += 2 * s.H * s.D * s.d + 2 * s.Hkv * s.D * s.d;  // wq, wk, wv, wo
    if (moe) {
      c.moe_layers += 1;
      const double experts = (s.E / p.ep) * 3 * s.d * s.fe;
      c.params += s.E * s.d + experts;  // the router reads its fp32 weight
      c.buffers += 2 * s.E;             // the router's bias: value and gradient
      c.expert_params += experts;
      c.gemm_params += experts;
    } else {
      c.params += 3 * s.d * s.f;
      c.gemm_params += 3 * s.d * s.f;
    }
  }
  return holds;
}

}  // namespace

ChunkCost chunk_cost(const Config& cfg, const MeshPlan& p, int vs) {
  const int n_virtual = p.pp * p.vpp;
  TRIDENT_CHECK(vs >= 0 && vs < n_virtual, "virtual stage out of range");
  const Shapes s(cfg, p);
  ChunkCost c;
  const auto [begin, end] = model::layer_range(cfg.model.n_layers, n_virtual, vs, p.pp_layout);
  c.first = vs == 0;
  c.last = vs == n_virtual - 1;
  c.layers = end - begin;
  // The core runs H/u heads over the pairs of the busiest rank of the ring of
  // r = cp/u groups (u = 1: the plain ring).
  // model.window bounds the pairs of every query, in every cp mode: the
  // window is over positions, which the head split does not change.
  // Packed documents: the pairs of their lengths' histogram (packed_attention.hpp).
  const bool packed = cfg.data.packing == Packing::documents && !cfg.doc_lengths_log2.empty();
  auto busiest = [&](int ring) {
    if (!packed)
      return window_pairs_busiest_rank(cfg.data.seq_len, ring, p.cp_layout, cfg.model.window);
    if (ring > 1 && ring == p.cp_ring() && p.packed_imbalance > 0)
      return packed_pairs_per_sequence(cfg.doc_lengths_log2, cfg.data.seq_len, cfg.model.window) /
             ring * p.packed_imbalance;
    return packed_pairs_busiest_rank(cfg.doc_lengths_log2, cfg.data.seq_len, ring, p.cp_layout,
                                     cfg.model.window);
  };
  const double pairs = busiest(p.cp_ring()) / p.cp_ulysses;
  c.attention_flops_total_f = c.layers * s.mbs * busiest(1) * 4 * s.H * s.D;
  const std::vector<LayerHold> holds = add_layers(cfg, p, s, pairs, begin, end, c);
  if (c.first) {
    c.f.memory_bytes += kFloat * 2 * s.T * s.d;  // embedding gather
    c.b.memory_bytes += kFloat * 2 * s.T * s.d;
    c.params += s.V * s.d;
    c.gemm_params += cfg.model.tie_embeddings ? s.V * s.d : 0;  // the tied head's weight
  }
  if (c.last) {
    const double head = 2 * s.T * s.d * s.V;
    c.f += Work{head, 0, kFloat * (2 * s.T * s.d + 3 * s.T * s.V)};
    c.b += Work{head, 0, kFloat * 2 * s.T * s.d};
    c.w += Work{head, 0, 0};
    c.params += s.d + (cfg.model.tie_embeddings ? 0 : s.V * s.d);  // tied: the embedding's
    c.gemm_params += cfg.model.tie_embeddings ? 0 : s.V * s.d;
    // x_final, h_final (bf16 under bf16) and dlogits; a split backward keeps
    // h_final and dlogits for W
    c.tracked.cache += kFloat * (s.T * s.d + s.T + s.T * s.V) + s.act * s.T * s.d;
    c.tracked.stash += s.act * s.T * s.d + kFloat * s.T * s.V;
    // B computes the head's weight gradient first, then frees h_final and dlogits
    c.tracked.freed_early = s.act * s.T * s.d + kFloat * s.T * s.V;
  } else {
    // the output the executor sends on, held until the send is seen complete
    c.tracked.cache += kFloat * s.T * s.d;
  }
  add_transients(s, holds, c);
  c.packing = packing_bytes(cfg, s, c.last);
  kernels::AttnShape probe;
  probe.D = s.D;
  c.workspace = std::max(c.workspace, double(kernels::attention_workspace_bytes(probe, true)));
  c.workspace = std::max(c.workspace, double(kernels::attention_workspace_bytes(probe, false)));
  add_cp_comm(s, p, c);
  if (p.ep > 1 && c.moe_layers > 0) {
    const double rows_out = s.T * s.k * double(p.ep - 1) / p.ep;
    c.f_comm.ep_bytes = c.moe_layers * 2 * rows_out * s.d * kFloat;  // dispatch + combine
    c.f_comm.ep_exchanges = c.moe_layers * 2;
    // the gradients take the same way back; a rerun forward exchanges again
    const double per_layer = 2 * rows_out * s.d * kFloat;
    c.b_comm.ep_bytes = c.f_comm.ep_bytes + c.moe_reruns * per_layer;
    c.b_comm.ep_exchanges = c.f_comm.ep_exchanges + c.moe_reruns * 2;
  }
  c.boundary_bytes = c.last ? 0 : kFloat * s.T * s.d;
  return c;
}

double activation_peak(const pp::Schedule& lowered, int rank,
                       const std::vector<ChunkMemory>& per_stage) {
  double live = 0, peak = 0;
  for (const pp::Action& a : lowered.ranks.at(size_t(rank))) {
    const ChunkMemory& m = per_stage.at(size_t(a.stage));
    if (a.op == pp::Op::F) {
      peak = std::max(peak, live + m.cache + m.transient_f);
      live += m.cache;
    } else if (a.op == pp::Op::B) {
      peak = std::max(peak, live + m.transient_b - (lowered.split_backward ? 0 : m.freed_early));
      live += (lowered.split_backward ? m.stash : 0) - m.cache;
    } else if (a.op == pp::Op::W) {
      live -= m.stash;
    }
  }
  return peak;
}

namespace {

// Everything but the activations (which include the pipeline's boundary
// tensors).
MemoryEstimate static_memory(const Config& cfg, const MeshPlan& p, int pp_rank) {
  const Shapes s(cfg, p);
  MemoryEstimate m;
  double expert = 0, work = 0, copies = 0, packing = 0, buffers = 0, packed = 0;
  // A GEMM weight under bf16: a bf16 copy (2 bytes, with the parameters), or
  // on the native CPU path its master packed (PackedBf16Weight: 4 bytes, its
  // columns a multiple of 32; host vectors outside the allocator) and no copy.
  // Only a CPU run packs: runtime.backend "cuda" or "emulated" keeps copies
  // ("automatic" is planned as the CPU run it is on a host without a GPU).
  const bool cpu_run =
      cfg.runtime.backend == Backend::cpu || cfg.runtime.backend == Backend::automatic;
  const bool packs = s.bf16 && cpu_run && kernels::cpu_bf16_packs_weights();
  const double copy_per_weight = s.bf16 && !packs ? 2 : 0;
  const double packed_per_weight =
      packs ? double(kernels::gemm_bf16_packed_weight_bytes(32, 32)) / 1024 : 0;
  int layers = 0;
  const pp::Placement place = placement_of(p);
  for (int stage : place.stages.at(size_t(pp_rank))) {
    const ChunkCost cc = chunk_cost(cfg, p, stage);
    m.params += kFloat * cc.params;
    expert += kFloat * cc.expert_params;
    copies += copy_per_weight * cc.gemm_params;
    buffers += kFloat * cc.buffers;
    packed += packed_per_weight * cc.gemm_params;
    work = std::max(work, cc.workspace);
    packing = std::max(packing, cc.packing);
    layers += cc.layers;
  }
  m.grads = m.params;
  // AdamW's m and v; sharded, each over its parameters' replicas (the dense
  // over dp x cp, the experts over (dp x cp) / ep). The gradient reduction
  // works in place on the stage's one gradient buffer: no packing buffer.
  m.optimizer = 2 * m.params;
  if (p.sharding == OptimizerSharding::dp)
    m.optimizer = 2 * ((m.params - expert) / (p.dp * p.cp) + expert / (p.dp * p.cp / p.ep));
  m.workspace = work + packing;
  m.untracked = packing;
  m.params += copies + buffers;
  m.param_copies = copies;
  m.buffers = buffers;
  m.packed_weights = packed;
  m.untracked += packed;
  double comm = 0;
  // every layer's ring keeps its backward's five K/V-sized buffers (current,
  // next, partial dK/dV, sending, arriving) of one sample
  const int u = p.cp_ulysses;
  const double hkv_u = u > 1 ? std::max(1.0, s.Hkv / u) : s.Hkv;
  if (p.cp_ring() > 1) comm += kFloat * layers * 5 * 2 * u * (s.T / s.mbs) * hkv_u * s.D;
  // Ulysses: the head-layout q, k, v, out, lse, dout, dq, dk, dv and the two
  // packing buffers of one sample, per layer
  if (u > 1) comm += kFloat * layers * (s.T / s.mbs) * (6 * s.H * s.D + s.H + 4 * u * hkv_u * s.D);
  m.comm_buffers = comm;
  return m;
}

// A checkpoint (every run writes one after its last step, when the
// activations are freed). A single file gathers AdamW's m and v of the
// rank's whole parameters, sharded or not, before writing them: the peak
// holds the larger of the two, counted with the activations. A sharded one
// writes each slice where it lies: nothing is copied.
double checkpoint_copies(const Config& cfg, const MemoryEstimate& m) {
  const double master = m.params - m.param_copies - m.buffers;
  return cfg.output.checkpoint_format == CheckpointFormat::single ? 2 * master : 0.0;
}

// Async saves stage the rank's share of the state (parameters and both
// moments, cut over the dp x cp replicas) in a host buffer of at most
// output.checkpoint_staging_mb, allocated at the first save and kept.
double checkpoint_staging(const Config& cfg, const MeshPlan& p, const MemoryEstimate& m) {
  if (!cfg.output.checkpoint_async || cfg.output.checkpoint_format != CheckpointFormat::sharded)
    return 0.0;
  const double share = 3 * (m.params - m.param_copies - m.buffers) / std::max(1, p.dp * p.cp);
  return std::min(share, double(cfg.output.checkpoint_staging_mb) * 1048576.0);
}

// Per virtual stage: the memory the allocator sees, and all of it.
void stage_memory(const Config& cfg, const MeshPlan& p, std::vector<ChunkMemory>& tracked,
                  std::vector<ChunkMemory>& all) {
  for (int vs = 0; vs < p.pp * p.vpp; ++vs) {
    const ChunkCost cc = chunk_cost(cfg, p, vs);
    tracked.push_back(cc.tracked);
    all.push_back(cc.tracked);
    all.back() += cc.untracked;
  }
}

}  // namespace

MemoryEstimate memory_of_rank(const Config& cfg, const MeshPlan& p, int pp_rank,
                              const pp::Schedule& lowered) {
  MemoryEstimate m = static_memory(cfg, p, pp_rank);
  std::vector<ChunkMemory> tracked, all;
  stage_memory(cfg, p, tracked, all);
  m.activations = activation_peak(lowered, pp_rank, all);
  m.untracked += m.activations - activation_peak(lowered, pp_rank, tracked);
  m.activations = std::max(m.activations, checkpoint_copies(cfg, m));
  m.workspace += checkpoint_staging(cfg, p, m);
  return m;
}

MemoryEstimate memory_lower_bound(const Config& cfg, const MeshPlan& p, int pp_rank) {
  MemoryEstimate m = static_memory(cfg, p, pp_rank);
  std::vector<ChunkMemory> tracked, all;
  stage_memory(cfg, p, tracked, all);
  double act = 0, act_tracked = 0;
  const pp::Placement place = placement_of(p);
  for (int stage : place.stages.at(size_t(pp_rank))) {
    const ChunkMemory &a = all[size_t(stage)], &t = tracked[size_t(stage)];
    act = std::max(act, a.cache + std::max(a.transient_f, a.transient_b));
    act_tracked = std::max(act_tracked, t.cache + std::max(t.transient_f, t.transient_b));
  }
  m.activations = std::max(act, checkpoint_copies(cfg, m));
  m.workspace += checkpoint_staging(cfg, p, m);
  m.untracked += act - act_tracked;
  return m;
}

}  // namespace trident::plan
