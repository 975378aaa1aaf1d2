// Cost model: FLOPs, bytes and memory of one rank's actions, counted from
// the model's code (see cost_model.hpp and share/trident/planner.md).
#include "trident/plan/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/parallel/cp/config_rules.hpp"
#include "trident/parallel/pp/generators.hpp"

namespace trident::plan {
namespace {

constexpr double kFloat = 4;           // bytes per fp32 value
constexpr double kIndex = 4;           // bytes per int32 routing entry
constexpr double kAttnBackward = 2.5;  // attention backward / forward FLOPs (P recomputed)

// Layers [begin, end) of virtual stage vs of n (the model's layer_range rule).
std::pair<int, int> stage_layers(int n_layers, int n_virtual, int vs) {
  const int base = n_layers / n_virtual, extra = n_layers % n_virtual;
  const int begin = vs * base + std::min(vs, extra);
  return {begin, begin + base + (vs < extra ? 1 : 0)};
}

// Shapes of one micro-batch on one rank.
struct Shapes {
  double T, d, H, Hkv, D, f, E, k, V, mbs, R;
  bool shm;  // the MoE exchange goes through the node's shared-memory slots
  Shapes(const Config& cfg, const MeshPlan& p) {
    const ModelConfig& m = cfg.model;
    mbs = p.micro_batch_size;
    T = mbs * double(cfg.data.seq_len) / p.cp;
    d = m.d_model;
    H = m.n_heads;
    Hkv = m.n_kv_heads;
    D = m.head_dim();
    f = m.ffn_hidden;
    E = m.n_experts;
    k = m.top_k;
    V = m.vocab_size;
    // expert-side rows of the busiest rank: the ep ranks' T k copies over ep ranks
    R = E > 0 ? T * k * moe_imbalance(T * k * p.ep, p.ep) : 0;
    // ep lies inside a node, where the automatic choice is the shm transport
    shm = p.ep > 1 && cfg.runtime.ep_transport != EpTransportChoice::alltoallv;
  }
};

// Attention block: the cache x (its input, shared with whoever made it), h1,
// rstd, q, k, v, o, lse; a split backward keeps o, h1, the incoming gradient
// and dq, dk, dv for W.
void add_attention_layer(const Shapes& s, double pairs, ChunkCost& c) {
  const double proj = 2 * s.T * s.d * (2 * s.H * s.D + 2 * s.Hkv * s.D);
  const double core = s.mbs * pairs * 4 * s.H * s.D;
  const double mem = kFloat * (7 * s.T * s.d + 2 * s.T * (s.H + s.Hkv) * s.D);
  c.f += Work{proj, core, mem};
  c.b += Work{proj, kAttnBackward * core, 2 * mem};
  c.w += Work{proj, 0, 0};
  const double qkv = 2 * s.T * s.H * s.D + 2 * s.T * s.Hkv * s.D;  // q, o and k, v (or grads)
  c.tracked.cache += kFloat * (2 * s.T * s.d + s.T + qkv + s.T * s.H);
  c.tracked.stash += kFloat * (2 * s.T * s.d + qkv);
}

// FFN block: x (the attention's output), h, rstd, then the dense SwiGLU's
// gate and up, or the MoE layer's cache (routing, plan, expert-side rows and
// gate/up; its input is the block's h).
void add_ffn_layer(const Shapes& s, bool moe, ChunkCost& c) {
  double gemm, mem = kFloat * 7 * s.T * s.d;
  c.tracked.cache += kFloat * (2 * s.T * s.d + s.T);
  if (moe) {
    gemm = 2 * s.T * s.d * s.E + 6 * s.R * s.d * s.f;
    mem += kFloat * (2 * s.T * s.E + 4 * s.T * s.k * s.d + 3 * s.R * s.f);
    // tensors: gate/up, and the expert side's rows in and out (in the node's
    // shared slots with shm, which keeps a tensor of the rows gathered back
    // instead); the input is the block's h, already counted; host vectors:
    // routing (logits, probabilities, lse, choices, weights) and the
    // dispatch plan's indices
    const double in_out = kFloat * 2 * s.R * s.d, kept = kFloat * s.T * s.k * s.d;
    c.tracked.cache += kFloat * 2 * s.R * s.f + (s.shm ? kept : in_out);
    c.untracked.cache += kFloat * (2 * s.T * s.E + 2 * s.T) + kIndex * 3 * s.T * s.k +
                         8 * 2 * s.T * s.k + (s.shm ? in_out : 0);
    // the MoE phase's temporaries (add_transients adds the block's): forward
    // the router logits; backward the row and weight gradients and dlogits
    c.tracked.transient_f = std::max(c.tracked.transient_f, kFloat * s.T * s.E);
    c.tracked.transient_b = std::max(
        c.tracked.transient_b, kFloat * (s.T * s.k * s.d + s.T * s.k + 2 * s.R * s.d + s.T * s.E));
    // one expert's rows from one source rank through the SwiGLU backward
    const double rows = s.T * s.k / s.E * moe_imbalance(s.T * s.k, int(s.E));
    c.workspace = std::max(c.workspace, kFloat * 2 * rows * s.f);
  } else {
    gemm = 6 * s.T * s.d * s.f;
    mem += kFloat * 3 * s.T * s.f;
    c.tracked.cache += kFloat * 2 * s.T * s.f;
    c.workspace = std::max(c.workspace, kFloat * 2 * s.T * s.f);  // SwiGLU backward: h, dh
  }
  // The SwiGLU and MoE kernels compute input and weight gradients in one
  // pass, so B carries both whether or not the schedule splits backward.
  c.f += Work{gemm, 0, mem};
  c.b += Work{2 * gemm, 0, 2 * mem};
}

// Temporaries of the chunk's F and B beyond its cache (every block writes a
// new tensor; caches share them). F: the head's logits. B: the incoming
// gradient, the block's new dx and, by phase, the FFN's dh; the attention's
// new dy, dh1, dout, dq, dk, dv (its layer's FFN cache is freed by then); the
// head's dh and dy; and from the second stage on the gradient sent back,
// allocated when B starts. Both: the pipeline executor posts the receives of
// the next two actions ahead (an input unless first, a gradient unless last).
void add_transients(const Shapes& s, double last_ffn_cache, ChunkCost& c) {
  const double Td = kFloat * s.T * s.d;
  const double ahead = Td * ((c.first ? 0 : 1) + (c.last ? 0 : 1));
  const double moe_f = c.tracked.transient_f, moe_b = c.tracked.transient_b;
  c.tracked.transient_f = ahead + std::max(moe_f, c.last ? kFloat * s.T * s.V : 0);
  const double attn =
      4 * Td + kFloat * (2 * s.T * s.H * s.D + 2 * s.T * s.Hkv * s.D) - last_ffn_cache;
  c.tracked.transient_b =
      ahead + (c.first ? 0 : Td) + std::max({3 * Td + moe_b, attn, c.last ? 2 * Td : 0});
}

}  // namespace

std::string MeshPlan::str() const {
  std::ostringstream o;
  o << "pp=" << pp << " vpp=" << vpp << " cp=" << cp << " ep=" << ep << " dp=" << dp << " "
    << config_name(schedule) << " " << config_name(cp_layout);
  if (cp_mode == CpMode::ulysses) o << " ulysses";
  if (cp_mode == CpMode::hybrid) o << " hybrid u=" << cp_ulysses;
  o << " mbs=" << micro_batch_size << " m=" << microbatches;
  return o.str();
}

pp::Placement placement_of(const MeshPlan& p) {
  return pp::schedule_placement(config_name(p.schedule), p.pp, p.vpp);
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

namespace {

// The CP communication of one action: the ring's K/V (and dK/dV) blocks and
// the Ulysses all-to-alls (planner.md, "Context-parallel modes").
void add_cp_comm(const Shapes& s, const MeshPlan& p, ChunkCost& c) {
  const int u = p.cp_ulysses, r = p.cp_ring();
  const double hkv_u =
      u > 1 ? std::max(1.0, s.Hkv / u) : s.Hkv;  // K/V heads per rank after the all-to-all
  if (r > 1) {
    // per layer and sample: K and V of the group's u Ls tokens (Ls = T/mbs),
    // r-1 ring steps
    const double kv = kFloat * 2 * u * (s.T / s.mbs) * hkv_u * s.D;
    c.f_comm.cp_bytes = c.layers * s.mbs * (r - 1) * kv;
    c.f_comm.cp_steps = c.layers * int(s.mbs) * (r - 1);
    c.b_comm.cp_bytes = 2 * c.f_comm.cp_bytes;  // K/V travel again and dK/dV come home
    c.b_comm.cp_steps = c.f_comm.cp_steps;
  }
  if (u > 1) {
    // per layer and sample, (u-1)/u of each tensor leaves the rank: q and out
    // [Ls, H, D], k and v [Ls, u hkv_u, D], lse [Ls, H]
    const double Ls = s.T / s.mbs, share = double(u - 1) / u;
    const double q = kFloat * Ls * s.H * s.D, kv = kFloat * Ls * u * hkv_u * s.D,
                 lse = kFloat * Ls * s.H;
    c.f_comm.a2a_bytes = c.layers * s.mbs * share * (2 * q + 2 * kv + lse);
    c.f_comm.a2a_calls = c.layers * int(s.mbs) * 5;
    c.b_comm.a2a_bytes = c.layers * s.mbs * share * (4 * q + 4 * kv + lse);
    c.b_comm.a2a_calls = c.layers * int(s.mbs) * 9;
  }
}

}  // namespace

ChunkCost chunk_cost(const Config& cfg, const MeshPlan& p, int vs) {
  const int n_virtual = p.pp * p.vpp;
  TRIDENT_CHECK(vs >= 0 && vs < n_virtual, "virtual stage out of range");
  const Shapes s(cfg, p);
  ChunkCost c;
  const auto [begin, end] = stage_layers(cfg.model.n_layers, n_virtual, vs);
  c.first = vs == 0;
  c.last = vs == n_virtual - 1;
  c.layers = end - begin;
  // The core runs H/u heads over the pairs of the busiest rank of the ring of
  // r = cp/u groups (u = 1: the plain ring).
  const double pairs =
      causal_pairs_busiest_rank(cfg.data.seq_len, p.cp_ring(), p.cp_layout) / p.cp_ulysses;
  c.attention_flops_total_f =
      c.layers * s.mbs * (double(cfg.data.seq_len) * (cfg.data.seq_len + 1) / 2) * 4 * s.H * s.D;
  const double attn_params = 2 * s.d + 2 * s.H * s.D * s.d + 2 * s.Hkv * s.D * s.d;  // + 2 norms
  double last_ffn_cache = 0;
  for (int l = begin; l < end; ++l) {
    const bool moe = cfg.model.is_moe_layer(l);
    add_attention_layer(s, pairs, c);
    const double before = c.tracked.cache;
    add_ffn_layer(s, moe, c);
    last_ffn_cache = c.tracked.cache - before;
    c.params += attn_params;
    if (moe) {
      c.moe_layers += 1;
      const double experts = (s.E / p.ep) * 3 * s.d * s.f;
      c.params += s.E * s.d + experts;
      c.expert_params += experts;
    } else {
      c.params += 3 * s.d * s.f;
    }
  }
  if (c.first) {
    c.f.memory_bytes += kFloat * 2 * s.T * s.d;  // embedding gather
    c.b.memory_bytes += kFloat * 2 * s.T * s.d;
    c.params += s.V * s.d;
  }
  if (c.last) {
    const double head = 2 * s.T * s.d * s.V;
    c.f += Work{head, 0, kFloat * (2 * s.T * s.d + 3 * s.T * s.V)};
    c.b += Work{head, 0, kFloat * 2 * s.T * s.d};
    c.w += Work{head, 0, 0};
    c.params += s.d + s.V * s.d;
    // x_final, h_final and dlogits; a split backward keeps h_final and dlogits for W
    c.tracked.cache += kFloat * (2 * s.T * s.d + s.T + s.T * s.V);
    c.tracked.stash += kFloat * (s.T * s.d + s.T * s.V);
    // B computes the head's weight gradient first, then frees h_final and dlogits
    c.tracked.freed_early = kFloat * (s.T * s.d + s.T * s.V);
  } else {
    // the output the executor sends on, held until the send is seen complete
    c.tracked.cache += kFloat * s.T * s.d;
  }
  add_transients(s, last_ffn_cache, c);
  kernels::AttnShape probe;
  probe.D = s.D;
  c.workspace = std::max(c.workspace, double(kernels::attention_workspace_bytes(probe, true)));
  c.workspace = std::max(c.workspace, double(kernels::attention_workspace_bytes(probe, false)));
  add_cp_comm(s, p, c);
  if (p.ep > 1 && c.moe_layers > 0) {
    const double rows_out = s.T * s.k * double(p.ep - 1) / p.ep;
    c.f_comm.ep_bytes = c.moe_layers * 2 * rows_out * s.d * kFloat;  // dispatch + combine
    c.f_comm.ep_exchanges = c.moe_layers * 2;
    c.b_comm.ep_bytes = c.f_comm.ep_bytes;  // the gradients take the same way back
    c.b_comm.ep_exchanges = c.f_comm.ep_exchanges;
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
  double expert = 0, work = 0;
  int layers = 0;
  const pp::Placement place = placement_of(p);
  for (int stage : place.stages.at(size_t(pp_rank))) {
    const ChunkCost cc = chunk_cost(cfg, p, stage);
    m.params += kFloat * cc.params;
    expert += kFloat * cc.expert_params;
    work = std::max(work, cc.workspace);
    layers += cc.layers;
  }
  m.grads = m.params;
  m.optimizer = 2 * m.params;
  // The gradient reduction packs each kind into the workspace, which keeps
  // its largest size.
  if (p.dp * p.cp > 1) work = std::max(work, m.params - expert);
  if (p.dp * p.cp / p.ep > 1) work = std::max(work, expert);
  m.workspace = work;
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
  m.activations = act;
  m.untracked += act - act_tracked;
  return m;
}

}  // namespace trident::plan
