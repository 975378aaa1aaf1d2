// Context parallelism: attention over a sequence split across the ranks of a
// CP group (ring attention).
//
// Each rank holds seq_len / cp tokens of q, k, v. K/V blocks travel around
// the ring (rank r sends to r+1, receives from r-1) for cp steps; at each
// step a rank attends its queries to the block it holds while the next block
// is already in flight, and merges the partial result through its
// log-sum-exp. Backward runs the same ring: dQ accumulates locally, dK/dV
// accumulate in a buffer that travels with its K/V block and arrives back at
// the block's owner after the last step.
//
// Layouts (which global positions a rank holds, in local order):
//   contiguous: rank r holds chunk r of cp equal chunks.
//   zigzag:     the sequence is cut into 2*cp chunks; rank r holds chunk r
//               followed by chunk 2*cp-1-r. With a causal mask every rank then
//               does the same work at every step (ZigZagLayout balance).
//   docs:       chosen per packed sequence from its documents
//               (cp/document_layout.hpp) and passed to each call in
//               LocalDocs::layout; a sequence without one (no packing) and
//               every layout-only function below use zigzag.
// Positions are global, so RoPE and the causal mask use the token's place in
// the whole sequence.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/comm/comm.hpp"
#include "trident/core/config.hpp"
#include "trident/core/profiler.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/context.hpp"
#include "trident/kernels/types/attention.hpp"

namespace trident::cp {

using Layout = CpLayout;  // parallel.cp_layout

// "contiguous" | "zigzag" | "docs"; anything else is an InputError.
Layout parse_layout(const std::string& name);
const char* layout_name(Layout layout);

// Throws InputError unless seq_len splits into the layout's chunks (seq_len %
// cp for contiguous, seq_len % (2*cp) for zigzag; cp/config_rules.hpp) and cp >= 1.
void check_layout(int64_t seq_len, int cp, Layout layout);

// A run of consecutive global positions held by one rank: local rows
// [local_offset, local_offset + length) hold positions [pos0, pos0 + length).
struct TokenRun {
  int64_t local_offset = 0;
  int64_t pos0 = 0;
  int64_t length = 0;
  bool operator==(const TokenRun&) const = default;
};

// The runs of every rank of a ring for one sequence: runs[r] are rank r's,
// in local order (parallel.cp_layout = "docs" gives one per sequence).
using SeqLayout = std::vector<std::vector<TokenRun>>;

// The runs of `rank` (one for contiguous, two for zigzag and docs), in local order.
//
// ulysses = u > 1 (cp_mode ulysses / hybrid): cp rank c = j*u + i belongs to
// ring group j of cp/u and is Ulysses rank i inside it. The group holds the
// tokens the layout gives ring rank j of cp/u, in that order, and rank i
// holds the i-th of u equal slices of them (a slice may span both zig-zag
// chunks, so up to three runs). The all-to-all then gives every rank of the
// group the group's whole token set in group order: what the ring over the
// cp/u groups expects.
std::vector<TokenRun> local_runs(int64_t seq_len, int cp, int rank, Layout layout, int ulysses = 1);

// Global positions of the local tokens of `rank` (seq_len / cp of them), in
// local order: what RoPE and RunFile::write_activation need.
std::vector<int64_t> local_positions(int64_t seq_len, int cp, int rank, Layout layout,
                                     int ulysses = 1);

// Copies the rows of `rank` out of global [seq_len, ...] (dimension 0 is the
// sequence) into local, its seq_len / cp rows in local order (e.g. to shard
// a sequence's inputs). local has global's row size and dtype in any shape;
// both on the host or on ctx's device (kernels::copy).
void scatter_to_local(const Tensor& global, const Tensor& local, int cp, int rank, Layout layout,
                      int ulysses = 1, const kernels::Ctx& ctx = {});
// The inverse: writes the local rows of `rank` to their rows of global.
void gather_to_global(const Tensor& local, const Tensor& global, int cp, int rank, Layout layout,
                      int ulysses = 1, const kernels::Ctx& ctx = {});

// The same two copies over explicit runs (one rank's runs of a SeqLayout).
void scatter_runs(const Tensor& global, const Tensor& local, const std::vector<TokenRun>& runs,
                  const kernels::Ctx& ctx = {});
void gather_runs(const Tensor& local, const Tensor& global, const std::vector<TokenRun>& runs,
                 const kernels::Ctx& ctx = {});

// Packed documents of this rank's tokens of one sequence, in local order:
// each token's document id (0-based in the sequence, non-decreasing along
// the sequence) in the memory of the ring's device (what the kernels read)
// and the same ids on the host (what the ring sends along with each K/V
// block and what decides which pairs of runs are skipped). Both null: one
// document. layout: the sequence's own layout (parallel.cp_layout = "docs",
// every rank passes the same one and holds the tokens of its runs[rank]);
// null: the ring's layout.
struct LocalDocs {
  const int32_t* device = nullptr;
  const int32_t* host = nullptr;
  const SeqLayout* layout = nullptr;
};

class RingAttention {
 public:
  // cp: the CP communicator, or nullptr / size 1 for plain local attention.
  // Not owned; must outlive this object. Scale is 1/sqrt(head_dim). The
  // kernels run with ctx (default: the host).
  RingAttention(Communicator* cp, Layout layout, bool causal, int64_t seq_len,
                const kernels::Ctx& ctx = {});

  int cp_size() const { return cp_size_; }
  int cp_rank() const { return cp_rank_; }
  int64_t local_tokens() const { return local_tokens_; }
  Layout layout() const { return layout_; }
  bool causal() const { return causal_; }
  // Global positions of this rank's tokens, in local order.
  const std::vector<int64_t>& positions() const { return positions_; }

  // Sliding window (model.window): a query sees keys less than `window`
  // positions back; 0 (the default): off.
  void set_window(int64_t window);
  int64_t window() const { return window_; }

  // One sequence: q [T_local, H, D], k/v [T_local, Hkv, D] (after RoPE),
  // tokens in local order. out [T_local, H, D] and lse [T_local, H] are
  // overwritten. Collective over the CP group. With docs, attention stays
  // inside each document: every K/V block travels with its tokens' document
  // ids (a small i32 message), and a (query tile, key run) pair without a
  // visible pair (documents, causal order, window) is skipped entirely.
  // Every rank of the group passes docs, or none does; docs.layout replaces
  // the ring's layout for this call.
  // Every tensor is f32 on the ring's device with the numel of its shape
  // above; the kernels run as tensor ops (kernels/functional.hpp).
  void forward(const Tensor& q, const Tensor& k, const Tensor& v, int H, int Hkv, int D,
               const Tensor& out, const Tensor& lse, const LocalDocs& docs = {});
  // Gradients given the forward's out and lse. dq, dk, dv are OVERWRITTEN
  // (unlike the kernel's, which accumulate). Collective over the CP group.
  void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                const Tensor& lse, const Tensor& dout, int H, int Hkv, int D, const Tensor& dq,
                const Tensor& dk, const Tensor& dv, const LocalDocs& docs = {});
  // Where the ring reports its work (nullptr: nowhere, and no clock is read).
  // Spans: "ring.forward" / "ring.backward" per compute span (chunk = ring
  // step; begin, and length = its kernel time without the MPI tests made in
  // between; a backward step's dK/dV sum is a second span of that step),
  // "ring.wait" per blocking wait on a ring transfer. Counters: ring.flops
  // (attention_flops, masked pairs not counted), ring.bytes_sent (K/V and
  // dK/dV), ring.progress_s (the MPI tests between query tiles),
  // ring.compute_cpu_s (the thread's CPU time in the compute spans),
  // ring.calls, and the peak ring.workspace_bytes (scratch one call held).
  // Sink::enter/leave bracket every compute span.
  void set_profiler(prof::Sink* sink) { sink_ = sink; }

 private:
  int source_rank(int step) const { return (cp_rank_ - step + cp_size_) % cp_size_; }
  void note_workspace(size_t bytes);
  // The K/V ring: this rank's block loaded into buf_.cur, the next block
  // posted while a step computes, and taken over once it has arrived.
  struct KvTransfer {
    Request send, recv;
    Request doc_send, doc_recv;  // the block's document ids (host memory, host communicator)
  };
  void load_kv(const Tensor& k, const Tensor& v);
  // Throws unless t is f32 on the ring's device with n elements.
  void check_io(const char* what, const Tensor& t, int64_t n) const;
  void check_call(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                  const Tensor& lse, int H, int Hkv, int D) const;
  // The documents of this call (docs_ empty: none): this rank's own, then
  // those of the block in compute (cur) and of the one arriving (nxt), on
  // the host, and cur's ids on the device for the kernels.
  // Also picks the call's runs (docs.layout, or the ring's own).
  void load_docs(const LocalDocs& docs);
  // The kernel's shape for one pair of runs, and its twin over the host ids
  // (for the skip decision and the FLOP count); false: no visible pair.
  // *pairs: the visible pairs over all heads when they were counted (packed
  // or windowed), else -1.
  bool pair_shapes(const TokenRun& qr, const TokenRun& kr, int H, int Hkv, int D,
                   kernels::AttnShape* dev, kernels::AttnShape* host, int64_t* pairs) const;
  KvTransfer post_kv(int step);
  void take_kv(int step, KvTransfer& t);
  // Backward: this step's dK/dV partial joins the accumulator travelling
  // the ring, which moves one rank on (touched: the step computed one).
  void pass_dkv(int step, bool touched, Request& dkv_send, Request& dkv_recv);

  kernels::Ctx ctx_;
  // Scratch of the kernel calls when the caller's ctx brings none: without
  // it every call (one per query tile and key run) would allocate and zero
  // its tiles anew, which a packed layout's many small calls pay for.
  std::unique_ptr<kernels::Workspace> own_workspace_;
  // K/V blocks in flight and dK/dV accumulators, kept between calls (every
  // call of one ring has the same sizes) so that a step allocates nothing.
  // They come from ctx's allocator (device memory on a GPU) and grow only
  // (kernels::reserve): a call uses the first block_floats_ of each.
  struct Buffers {
    Tensor cur, nxt, partial, sending, arriving;
  } buf_;
  int64_t block_floats_ = 0;  // one [K | V] (or [dK | dV]) block of this call
  size_t block_bytes() const { return size_t(block_floats_) * sizeof(float); }
  Communicator* comm_;
  Layout layout_;
  bool causal_;
  int64_t window_ = 0;
  // Documents of the current call (see load_docs).
  bool packed_ = false;
  const int32_t* own_docs_dev_ = nullptr;
  std::vector<int32_t> own_docs_, cur_docs_, nxt_docs_;
  Tensor cur_docs_dev_;  // device copy of cur_docs_ (unused on the host device)
  const int32_t* cur_docs_dev_ptr_ = nullptr;
  int64_t seq_len_;
  int cp_size_ = 1, cp_rank_ = 0;
  int64_t local_tokens_ = 0;
  std::vector<int64_t> positions_;
  SeqLayout runs_;                       // runs of every rank of the ring (its layout)
  const SeqLayout* call_runs_ = &runs_;  // those of the current call
  prof::Sink* sink_ = nullptr;
  void count(const char* counter, double amount) {
    if (sink_) sink_->add(counter, amount);
  }
  // A blocking wait on a ring transfer, reported as a "ring.wait" span.
  void timed_wait(Request& r);
};

}  // namespace trident::cp
