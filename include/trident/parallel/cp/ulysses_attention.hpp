// Context parallelism by all-to-all (DeepSpeed Ulysses), alone or under a
// ring (USP "hybrid"): parallel.cp_mode = "ulysses" | "hybrid".
//
// The cp group of cp = u * r ranks is cut into r Ulysses groups of u
// consecutive cp ranks (inside one NVLink domain) and u rings of r ranks, one
// per Ulysses index (across domains). Each rank holds seq_len / cp tokens of
// every head (cp::local_runs with ulysses = u gives which). Forward:
//   1. all-to-all inside the Ulysses group, tokens -> heads: every rank gets
//      all T/r tokens of its group for n_heads/u query heads (and the K/V
//      heads those need);
//   2. ring attention over the r groups (RingAttention, zig-zag and overlap
//      as ever) on those heads, or local attention when r = 1;
//   3. all-to-all back, heads -> tokens, for the output and its LSE.
// Backward re-exchanges q, k, v, out, lse and dout into the head layout, runs
// the ring backward, and sends dQ, dK, dV back.
//
// Packed documents and sliding windows: after the all-to-all a rank holds
// every token of its group, so it needs the document ids of all of them. The
// group gathers its ranks' ids (one small host all-gather per call, in the
// order the all-to-all stacks the tokens) and hands them to the ring, which
// masks and skips exactly as with cp_mode = "ring" (ring_attention.hpp). The
// window is the ring's too; heads do not change which pairs are visible.
//
// Grouped-query attention: rank i of a group takes query heads
// [i*H/u, (i+1)*H/u). With n_kv_heads % u == 0 it takes the n_kv_heads/u K/V
// heads they read; with u % n_kv_heads == 0 its query heads all read one K/V
// head, which it receives whole: each K/V head then lives on u/n_kv_heads
// ranks (the least replication that keeps every rank's query heads complete),
// and its gradient is the sum of those ranks' parts, added in rank order on
// the way back. Other (n_heads, n_kv_heads, u) are input errors
// (cp/config_rules.hpp).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/profiler.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"
#include "trident/parallel/cp/ring_attention.hpp"

namespace trident::cp {

class UlyssesAttention {
 public:
  // cp: the whole cp group (not owned; outlives this object). The first
  // forward or backward splits off the Ulysses group and the ring from it
  // (CommKind::cp, so their bytes count as cp traffic), so that they inherit
  // what cp was given after construction (train::run's device staging).
  // ulysses: u, dividing cp. H, Hkv, D: the model's heads; breaking the head
  // rule is an InputError.
  UlyssesAttention(Communicator* cp, int ulysses, Layout layout, bool causal, int64_t seq_len,
                   int H, int Hkv, int D, const kernels::Ctx& ctx = {});

  int ulysses() const { return u_; }
  int ring_size() const { return ring_size_; }
  int64_t local_tokens() const { return tl_; }
  // Global positions of this rank's tokens, in local order.
  const std::vector<int64_t>& positions() const { return positions_; }
  // Heads each rank attends after the all-to-all: n_heads/u query heads
  // (rank i's start at i*n_heads/u) and kv_heads() K/V heads starting at
  // kv_first(i).
  int q_heads() const { return hq_; }
  int kv_heads() const { return hkv_local_; }
  int kv_first(int i) const;

  // Sliding window (model.window), as RingAttention::set_window.
  void set_window(int64_t window);

  // One sequence in token layout: q [T_local, H, D], k/v [T_local, Hkv, D]
  // (after RoPE). out [T_local, H, D] and lse [T_local, H] are overwritten.
  // docs: this rank's tokens' document ids, as for RingAttention (every rank
  // of the cp group passes them, or none does). Collective over the cp group.
  // Every tensor f32 on the ring's device (as RingAttention's).
  void forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
               const Tensor& lse, const LocalDocs& docs = {});
  // dq, dk, dv OVERWRITTEN. Collective over the cp group.
  void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                const Tensor& lse, const Tensor& dout, const Tensor& dq, const Tensor& dk,
                const Tensor& dv, const LocalDocs& docs = {});
  // Reports the ring's spans and counters (RingAttention::set_profiler) and
  // its own: "ulysses.alltoall" spans (packing, the exchange and unpacking),
  // the counter ulysses.bytes_sent (bytes this rank sent to other ranks) and
  // the peak ulysses.workspace_bytes.
  void set_profiler(prof::Sink* sink);

 private:
  // Token layout x [tl_, hx, w] -> head layout dst [u*tl_, n, w]: rank d gets
  // heads [first(d), first(d) + n) of every local token, and the block from
  // rank s lands in rows [s*tl_, (s+1)*tl_).
  template <typename First>
  void to_heads(const Tensor& x, int hx, int n, int w, First first, Tensor& dst);
  // The inverse for y [u*tl_, n, w] -> x [tl_, hx, w]; with `sum`, x is
  // zeroed and the blocks of every source are added (replicated K/V heads).
  template <typename First>
  void to_tokens(const Tensor& y, int hx, int n, int w, First first, bool sum, const Tensor& x);
  // send's u blocks of per_peer f32 go one to each rank of the group; recv
  // gets theirs in rank order (both at least u * per_peer, on the ring's device).
  void exchange(const Tensor& send, const Tensor& recv, int64_t per_peer);
  void note_workspace();
  // The groups and the ring, made on first use (collective over cp).
  void connect();
  // The document ids of the group's tokens in head-layout order (gathered
  // from its ranks), or none when docs is empty.
  LocalDocs group_docs(const LocalDocs& docs);

  kernels::Ctx ctx_;
  Communicator* cp_;
  Layout layout_;
  bool causal_;
  int64_t seq_len_;
  std::unique_ptr<Communicator> group_, ring_comm_;
  int u_ = 1, ring_size_ = 1;  // Ulysses group size, ring length
  int H_, Hkv_, D_;
  int hq_ = 0, hkv_local_ = 0;
  int64_t tl_ = 0;
  int64_t window_ = 0;
  std::vector<int64_t> positions_;
  std::vector<int32_t> group_docs_;  // the group's ids on the host (group_docs)
  Tensor group_docs_dev_;            // and on the ring's device when that is not the host
  std::unique_ptr<RingAttention> ring_;
  struct Buffers {
    Tensor pack, unpack, q, k, v, out, lse, dout, dq, dk, dv;
  } buf_;
  prof::Sink* sink_ = nullptr;
};

}  // namespace trident::cp
