// Ring attention over the CP communicator, forward and backward side by side
// (see parallel/cp/ring_attention.hpp).
//
// Forward, step s = 0..cp-1: this rank holds the K/V block of rank r - s. It
// posts the receive of the next block and the send of the current one, runs
// the attention kernel for every (query run, key run) pair the mask does not
// skip, continuing the running (out, lse) of the keys seen so far
// (attention_forward_resume: the LSE merge without a partial buffer), and only
// then waits.
//
// Backward: same ring for K/V. The dK/dV of the block held at step s are
// computed into a local partial buffer while the accumulated dK/dV of that
// block (sent by the left neighbour at the end of its step s-1) is in
// flight; after the compute the two are summed and sent on. After step cp-1
// the buffer that arrives is this rank's own block's complete dK/dV.
//
// Progress: MPI (UCX's rendezvous protocol in particular) moves a large
// message only when the library is entered, so a transfer posted before the
// compute could otherwise sit idle until the wait after it. The compute is
// therefore cut into query tiles (the kernel's own kQueryBlock rows, so the
// arithmetic is unchanged) and every pending ring request is tested between
// tiles.
#include "trident/parallel/cp/ring_attention.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <initializer_list>
#include <limits>

#include "trident/core/error.hpp"
#include "trident/kernels/functional.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/parallel/cp/config_rules.hpp"

namespace trident::cp {

namespace {

constexpr int kTagKv = 3101;   // K/V block moving forward along the ring
constexpr int kTagDkv = 3102;  // dK/dV accumulator travelling with its block
constexpr int kTagDoc = 3103;  // the K/V block's document ids (packed documents)

// CPU time of the calling thread: unlike the wall clock, it does not grow
// while the rank waits for a core (oversubscribed runs).
double thread_cpu_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

}  // namespace

Layout parse_layout(const std::string& name) {
  if (auto layout = parse_config_name<Layout>(name)) return *layout;
  throw InputError("cp layout '" + name + "': must be \"zigzag\", \"contiguous\" or \"docs\"");
}

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::zigzag:
      return "zigzag";
    case Layout::docs:
      return "docs";
    case Layout::contiguous:
      break;
  }
  return "contiguous";
}

void check_layout(int64_t seq_len, int cp, Layout layout) {
  if (cp < 1) throw InputError("parallel.cp=" + std::to_string(cp) + ": must be >= 1");
  const std::string broken = layout_rule_broken(seq_len, cp, layout);
  if (!broken.empty()) throw InputError(broken);
}

std::vector<TokenRun> local_runs(int64_t seq_len, int cp, int rank, Layout layout, int ulysses) {
  check_layout(seq_len, cp, layout);
  TRIDENT_CHECK(rank >= 0 && rank < cp,
                "cp rank " + std::to_string(rank) + " outside cp=" + std::to_string(cp));
  TRIDENT_CHECK(ulysses >= 1 && cp % ulysses == 0, "Ulysses group of " + std::to_string(ulysses) +
                                                       " does not divide cp=" + std::to_string(cp));
  const int ring = cp / ulysses, j = rank / ulysses, i = rank % ulysses;
  std::vector<TokenRun> group;
  if (layout == Layout::contiguous) {
    const int64_t t = seq_len / ring;
    group = {TokenRun{0, j * t, t}};
  } else {  // zigzag, and docs for a sequence without its own layout
    const int64_t c = seq_len / (2 * int64_t(ring));
    group = {TokenRun{0, j * c, c}, TokenRun{c, (2 * int64_t(ring) - 1 - j) * c, c}};
  }
  if (ulysses == 1) return group;
  // Rank i's slice [lo, hi) of the group's local order.
  const int64_t tl = seq_len / cp, lo = i * tl, hi = lo + tl;
  std::vector<TokenRun> mine;
  for (const TokenRun& r : group) {
    const int64_t b = std::max(lo, r.local_offset), e = std::min(hi, r.local_offset + r.length);
    if (b < e) mine.push_back(TokenRun{b - lo, r.pos0 + (b - r.local_offset), e - b});
  }
  return mine;
}

std::vector<int64_t> local_positions(int64_t seq_len, int cp, int rank, Layout layout,
                                     int ulysses) {
  std::vector<int64_t> pos;
  pos.reserve(size_t(seq_len / cp));
  for (const TokenRun& r : local_runs(seq_len, cp, rank, layout, ulysses))
    for (int64_t i = 0; i < r.length; ++i) pos.push_back(r.pos0 + i);
  return pos;
}

namespace {

// The rows of `runs` between global [seq_len, ...] and local, which holds
// exactly the runs' rows (of global's size and dtype): into local when
// to_local, else back into global.
void copy_runs(const Tensor& global, const Tensor& local, const std::vector<TokenRun>& runs,
               bool to_local, const kernels::Ctx& ctx) {
  TRIDENT_CHECK(global.ndim() >= 1 && global.dim(0) > 0,
                "cp: a global tensor " + global.shape_str() + " has no sequence rows");
  const int64_t row = global.numel() / global.dim(0);
  int64_t rows = 0;
  for (const TokenRun& r : runs) rows += r.length;
  TRIDENT_CHECK(local.dtype() == global.dtype() && local.numel() == rows * row,
                "cp: local " + local.shape_str() + " " + dtype_name(local.dtype()) + " is not " +
                    std::to_string(rows) + " rows of global " + global.shape_str() + " " +
                    dtype_name(global.dtype()));
  for (const TokenRun& r : runs) {
    Tensor g = global.view(r.pos0 * row, {r.length * row});
    Tensor l = local.view(r.local_offset * row, {r.length * row});
    if (to_local)
      kernels::copy(ctx, l, g);
    else
      kernels::copy(ctx, g, l);
  }
}

int64_t seq_rows(const Tensor& global) { return global.ndim() >= 1 ? global.dim(0) : 0; }

}  // namespace

void scatter_to_local(const Tensor& global, const Tensor& local, int cp, int rank, Layout layout,
                      int ulysses, const kernels::Ctx& ctx) {
  copy_runs(global, local, local_runs(seq_rows(global), cp, rank, layout, ulysses), true, ctx);
}

void gather_to_global(const Tensor& local, const Tensor& global, int cp, int rank, Layout layout,
                      int ulysses, const kernels::Ctx& ctx) {
  copy_runs(global, local, local_runs(seq_rows(global), cp, rank, layout, ulysses), false, ctx);
}

void scatter_runs(const Tensor& global, const Tensor& local, const std::vector<TokenRun>& runs,
                  const kernels::Ctx& ctx) {
  copy_runs(global, local, runs, true, ctx);
}

void gather_runs(const Tensor& local, const Tensor& global, const std::vector<TokenRun>& runs,
                 const kernels::Ctx& ctx) {
  copy_runs(global, local, runs, false, ctx);
}

RingAttention::RingAttention(Communicator* cp, Layout layout, bool causal, int64_t seq_len,
                             const kernels::Ctx& ctx)
    : ctx_(ctx), comm_(cp), layout_(layout), causal_(causal), seq_len_(seq_len) {
  if (!ctx_.workspace) {
    own_workspace_ = std::make_unique<kernels::Workspace>(kernels::allocator_of(ctx_));
    ctx_.workspace = own_workspace_.get();
  }
  if (comm_ && comm_->size() > 1) {
    cp_size_ = comm_->size();
    cp_rank_ = comm_->rank();
  } else {
    comm_ = nullptr;  // one rank: no ring, plain local attention
  }
  check_layout(seq_len, cp_size_, layout);
  local_tokens_ = seq_len / cp_size_;
  positions_ = local_positions(seq_len, cp_size_, cp_rank_, layout);
  for (int r = 0; r < cp_size_; ++r) runs_.push_back(local_runs(seq_len, cp_size_, r, layout));
}

void RingAttention::note_workspace(size_t bytes) {
  if (sink_) sink_->peak("ring.workspace_bytes", double(bytes));
}

void RingAttention::timed_wait(Request& r) {
  if (!sink_) return comm_->wait(r);
  prof::Span span{"ring.wait"};
  span.t_begin_s = now_s();
  comm_->wait(r);
  span.t_end_s = now_s();
  sink_->span(span);
}

namespace {

// The run cut into pieces of kQueryBlock rows, in order: the ring calls the
// kernel once per piece so that it can drive MPI progress in between.
std::vector<TokenRun> query_tiles(const TokenRun& run) {
  std::vector<TokenRun> tiles;
  for (int64_t i = 0; i < run.length; i += kernels::kQueryBlock)
    tiles.push_back(TokenRun{run.local_offset + i, run.pos0 + i,
                             std::min(kernels::kQueryBlock, run.length - i)});
  return tiles;
}

// One compute span (a step's kernels, a dK/dV sum), reported to the sink when
// it ends: its length is its wall time less the MPI tests made inside it,
// which are communication (ring.progress_s): with a shared-memory transport a
// test can copy a whole block, and how much of that lands in which span
// depends on the other ranks' timing, not on this rank's work. Without a sink
// nothing is timed. The sink's enter/leave bracket it, outside the clock.
class ComputeSpan {
 public:
  ComputeSpan(prof::Sink* sink, const char* kind, int step) : sink_(sink) {
    if (!sink_) return;
    sink_->enter(kind);
    span_.kind = kind;
    span_.chunk = step;
    span_.t_begin_s = now_s();
    c0_ = thread_cpu_s();
  }
  ComputeSpan(const ComputeSpan&) = delete;
  ComputeSpan& operator=(const ComputeSpan&) = delete;
  ~ComputeSpan() {
    if (!sink_) return;
    const double cpu = thread_cpu_s() - c0_ - progress_cpu_s_;
    span_.t_end_s = now_s() - progress_s_;
    sink_->span(span_);
    sink_->add("ring.compute_cpu_s", cpu);
    sink_->add("ring.progress_s", progress_s_);
    sink_->add("ring.flops", flops);
    sink_->leave(span_.kind);
  }
  // Tests (never waits on) the ring's in-flight requests: each test lets MPI
  // advance them. Completed or empty requests cost nothing.
  void drive_progress(Communicator* comm, std::initializer_list<Request*> pending) {
    if (!comm) return;
    if (!sink_) {
      for (Request* r : pending) comm->test(*r);
      return;
    }
    const double p0 = now_s(), u0 = thread_cpu_s();
    for (Request* r : pending) comm->test(*r);
    progress_s_ += now_s() - p0;
    progress_cpu_s_ += thread_cpu_s() - u0;
  }
  double flops = 0;  // attention FLOPs of the span's kernel calls

 private:
  prof::Sink* sink_;
  prof::Span span_;
  double c0_ = 0, progress_s_ = 0, progress_cpu_s_ = 0;
};

// Every (query tile, key run) pair of one ring step that is not fully
// masked: on_pair(qr, kr, shape), then after_query_run() after each of this
// rank's query runs. Key runs outermost: with two key runs (a zig-zag step
// below the diagonal) the queries sweep one run's K/V at a time, so the
// working set is that of a step with one key run and both query runs (with
// the query tile outermost a backward step's K, V, dK and dV no longer fit
// the L2, which unbalances the ranks).
// shapes(qr, kr, &dev, &host, &pairs) builds the pair's kernel shape and its
// host twin (and the visible pairs when it counted them), false when the
// mask hides the whole pair.
template <typename Shapes, typename OnPair, typename AfterRun>
void for_each_pair(const std::vector<TokenRun>& key_runs, const std::vector<TokenRun>& my_runs,
                   Shapes&& shapes, OnPair&& on_pair, AfterRun&& after_query_run) {
  for (const TokenRun& kr : key_runs) {
    for (const TokenRun& run : my_runs) {
      for (const TokenRun& qr : query_tiles(run)) {
        kernels::AttnShape s, host;
        int64_t pairs = -1;
        if (shapes(qr, kr, &s, &host, &pairs)) on_pair(qr, kr, s, host, pairs);
      }
      after_query_run();
    }
  }
}

}  // namespace

void RingAttention::set_window(int64_t window) {
  TRIDENT_CHECK(window >= 0, "RingAttention: window " + std::to_string(window) + " < 0");
  window_ = window;
}

bool RingAttention::pair_shapes(const TokenRun& qr, const TokenRun& kr, int H, int Hkv, int D,
                                kernels::AttnShape* dev, kernels::AttnShape* host,
                                int64_t* pairs) const {
  *pairs = -1;
  // All keys after all queries: the causal skip of the unpacked ring.
  if (causal_ && kr.pos0 > qr.pos0 + qr.length - 1) return false;
  kernels::AttnShape& s = *dev;
  s.Tq = qr.length;
  s.Tk = kr.length;
  s.H = H;
  s.Hkv = Hkv;
  s.D = D;
  s.scale = 1.0f / std::sqrt(float(D));
  s.causal = causal_;
  s.q_pos0 = qr.pos0;
  s.k_pos0 = kr.pos0;
  s.window = window_;
  *host = s;
  if (packed_) {
    s.q_doc = own_docs_dev_ + qr.local_offset;
    s.k_doc = cur_docs_dev_ptr_ + kr.local_offset;
    host->q_doc = own_docs_.data() + qr.local_offset;
    host->k_doc = cur_docs_.data() + kr.local_offset;
  }
  if (!packed_ && window_ == 0) return true;
  // Documents: the runs' ids are sorted, so when the query tile's documents
  // and the key run's do not overlap no pair is visible (most pairs of a
  // packed ring step), found without counting.
  if (packed_ &&
      (host->q_doc[qr.length - 1] < host->k_doc[0] || host->q_doc[0] > host->k_doc[kr.length - 1]))
    return false;
  // Otherwise skipped unless some pair is visible: the exact count over the
  // host ids, O(Tq log Tk), kept for the FLOP count.
  *pairs = kernels::attention_visible_pairs(*host);
  return *pairs > 0;
}

namespace {
// Attention FLOPs of one call: from the pairs pair_shapes counted, or counted now.
double call_flops(const kernels::AttnShape& host, int64_t pairs, bool backward) {
  if (pairs < 0) return kernels::attention_flops(host, backward);
  return (backward ? 10.0 : 4.0) * double(host.D) * double(pairs);
}
}  // namespace

void RingAttention::load_docs(const LocalDocs& docs) {
  TRIDENT_CHECK((docs.device == nullptr) == (docs.host == nullptr),
                "RingAttention: document ids on the device and not on the host, or the reverse");
  packed_ = docs.host != nullptr;
  call_runs_ = &runs_;
  if (docs.layout) {
    TRIDENT_CHECK(packed_, "RingAttention: a sequence layout without document ids");
    const SeqLayout& runs = *docs.layout;
    TRIDENT_CHECK(int(runs.size()) == cp_size_,
                  "RingAttention: a sequence layout for " + std::to_string(runs.size()) +
                      " ranks on a ring of " + std::to_string(cp_size_));
    for (const auto& rank_runs : runs) {
      int64_t n = 0;
      for (const TokenRun& r : rank_runs) {
        TRIDENT_CHECK(
            r.local_offset == n && r.length > 0 && r.pos0 >= 0 && r.pos0 + r.length <= seq_len_,
            "RingAttention: a sequence layout's runs do not tile a rank's tokens");
        n += r.length;
      }
      TRIDENT_CHECK(n == local_tokens_, "RingAttention: a sequence layout gives a rank " +
                                            std::to_string(n) + " tokens, not " +
                                            std::to_string(local_tokens_));
    }
    call_runs_ = &runs;
  }
  if (!packed_) return;
  own_docs_dev_ = docs.device;
  own_docs_.assign(docs.host, docs.host + local_tokens_);
  cur_docs_ = own_docs_;
  nxt_docs_.resize(size_t(local_tokens_));
  cur_docs_dev_ptr_ = own_docs_dev_;
}

namespace {
// n elements of t from offset (a flat view: one run of tokens of a buffer).
Tensor span(const Tensor& t, int64_t offset, int64_t n) { return t.view(offset, {n}); }
}  // namespace

void RingAttention::check_io(const char* what, const Tensor& t, int64_t n) const {
  TRIDENT_CHECK(t.numel() == n && t.dtype() == DType::f32 && t.device() == ctx_.device,
                std::string("RingAttention: ") + what + " " + t.shape_str() + " " +
                    dtype_name(t.dtype()) + " on " + t.device().str() + " should be " +
                    std::to_string(n) + " f32 on " + ctx_.device.str());
}

void RingAttention::load_kv(const Tensor& k, const Tensor& v) {
  const int64_t nkv = k.numel();
  block_floats_ = 2 * nkv;
  kernels::reserve(ctx_, buf_.cur, block_floats_);
  if (comm_) kernels::reserve(ctx_, buf_.nxt, block_floats_);
  Tensor k_dst = span(buf_.cur, 0, nkv), v_dst = span(buf_.cur, nkv, nkv);
  kernels::copy(ctx_, k_dst, span(k, 0, nkv));
  kernels::copy(ctx_, v_dst, span(v, 0, nkv));
}

RingAttention::KvTransfer RingAttention::post_kv(int step) {
  KvTransfer t;
  if (!comm_ || step + 1 >= cp_size_) return t;
  const int next = (cp_rank_ + 1) % cp_size_, prev = (cp_rank_ - 1 + cp_size_) % cp_size_;
  // One group: a device backend (NCCL) must post a rank's send and receive
  // together, or every rank's send waits for a receive that is queued behind it.
  comm_->begin_group();
  t.recv = comm_->irecv(buf_.nxt.ptr(), block_bytes(), prev, kTagKv);
  t.send = comm_->isend(buf_.cur.ptr(), block_bytes(), next, kTagKv);
  comm_->end_group();
  count("ring.bytes_sent", double(block_bytes()));
  if (packed_) {  // the ids travel on the host, beside the block
    const size_t bytes = cur_docs_.size() * sizeof(int32_t);
    Communicator& host = comm_->host();
    t.doc_recv = host.irecv(nxt_docs_.data(), bytes, prev, kTagDoc);
    t.doc_send = host.isend(cur_docs_.data(), bytes, next, kTagDoc);
    count("ring.bytes_sent", double(bytes));
  }
  return t;
}

void RingAttention::take_kv(int step, KvTransfer& t) {
  if (!comm_ || step + 1 >= cp_size_) return;
  timed_wait(t.recv);
  timed_wait(t.send);
  std::swap(buf_.cur, buf_.nxt);
  if (!packed_) return;
  comm_->host().wait(t.doc_recv);
  comm_->host().wait(t.doc_send);
  std::swap(cur_docs_, nxt_docs_);
  if (ctx_.device.is_cpu()) {
    cur_docs_dev_ptr_ = cur_docs_.data();
  } else {  // the kernels read the ids from the device: one small upload per step
    cur_docs_dev_ = kernels::from_host(ctx_, cur_docs_.data(), {local_tokens_}, DType::i32);
    cur_docs_dev_ptr_ = cur_docs_dev_.data<int32_t>();
  }
}

void RingAttention::check_call(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                               const Tensor& lse, int H, int Hkv, int D) const {
  const int64_t T = local_tokens_;
  check_io("q", q, T * H * D);
  check_io("k", k, T * Hkv * D);
  check_io("v", v, T * Hkv * D);
  check_io("out", out, T * H * D);
  check_io("lse", lse, T * H);
}

void RingAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, int H, int Hkv,
                            int D, const Tensor& out, const Tensor& lse, const LocalDocs& docs) {
  check_call(q, k, v, out, lse, H, Hkv, D);
  const int64_t T = local_tokens_, nkv = k.numel();
  // Double buffer of [K | V]: one in compute, one arriving.
  load_kv(k, v);
  load_docs(docs);
  kernels::fill(ctx_, out, 0.0f);
  kernels::fill(ctx_, lse, -std::numeric_limits<float>::infinity());
  kernels::AttnShape probe{T, T, H, Hkv, D, 1.0f, causal_, 0, 0};
  note_workspace(buf_.cur.bytes() + buf_.nxt.bytes() +
                 kernels::attention_workspace_bytes(probe, false));

  auto shapes = [&](const TokenRun& qr, const TokenRun& kr, kernels::AttnShape* s,
                    kernels::AttnShape* host,
                    int64_t* pairs) { return pair_shapes(qr, kr, H, Hkv, D, s, host, pairs); };
  for (int step = 0; step < cp_size_; ++step) {
    KvTransfer kv = post_kv(step);
    {
      ComputeSpan span_of_step(sink_, "ring.forward", step);
      const Tensor cur = buf_.cur;
      for_each_pair((*call_runs_)[size_t(source_rank(step))], (*call_runs_)[size_t(cp_rank_)],
                    shapes,
                    [&](const TokenRun& qr, const TokenRun& kr, const kernels::AttnShape& s,
                        const kernels::AttnShape& host, int64_t pairs) {
                      const int64_t qo = qr.local_offset * H * D, ko = kr.local_offset * Hkv * D;
                      const int64_t nqt = qr.length * H * D, nkt = kr.length * Hkv * D;
                      // Merges into (out, lse) as it goes: the LSE merge is the kernel's
                      // online softmax continued from the keys of earlier pairs and steps.
                      kernels::attention_forward_resume(
                          ctx_, s, span(q, qo, nqt), span(cur, ko, nkt), span(cur, nkv + ko, nkt),
                          span(out, qo, nqt), span(lse, qr.local_offset * H, qr.length * H));
                      if (sink_) span_of_step.flops += call_flops(host, pairs, false);
                    },
                    [&] {
                      span_of_step.drive_progress(comm_, {&kv.recv, &kv.send});
                    });
    }
    take_kv(step, kv);
  }
  count("ring.calls", 1);
}

void RingAttention::pass_dkv(int step, bool touched, Request& dkv_send, Request& dkv_recv) {
  Tensor& partial = buf_.partial;
  Tensor& sending = buf_.sending;
  Tensor& arriving = buf_.arriving;
  if (step == 0) {
    std::swap(sending, partial);  // this rank's own block starts its journey
  } else {
    timed_wait(dkv_recv);  // the block's accumulator from the left neighbour
    timed_wait(dkv_send);  // the previous one has left: its buffer is free
    if (touched) {         // a step without a visible pair adds nothing
      ComputeSpan sum_span(sink_, "ring.backward", step);
      kernels::add_inplace(ctx_, span(arriving, 0, block_floats_), span(partial, 0, block_floats_));
    }
    std::swap(sending, arriving);
  }
  // After the last step this receive brings back this rank's own block.
  const int next = (cp_rank_ + 1) % cp_size_, prev = (cp_rank_ - 1 + cp_size_) % cp_size_;
  comm_->begin_group();  // as in post_kv
  dkv_recv = comm_->irecv(arriving.ptr(), block_bytes(), prev, kTagDkv);
  dkv_send = comm_->isend(sending.ptr(), block_bytes(), next, kTagDkv);
  comm_->end_group();
  count("ring.bytes_sent", double(block_bytes()));
}

void RingAttention::backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& lse, const Tensor& dout, int H, int Hkv, int D,
                             const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const LocalDocs& docs) {
  check_call(q, k, v, out, lse, H, Hkv, D);
  check_io("dout", dout, q.numel());
  check_io("dq", dq, q.numel());
  check_io("dk", dk, k.numel());
  check_io("dv", dv, v.numel());
  const int64_t T = local_tokens_, nkv = k.numel();
  load_kv(k, v);
  load_docs(docs);
  // [dK | dV]: the partial of the current step, the accumulator being sent
  // on, and the one arriving.
  Tensor& partial = buf_.partial;
  kernels::reserve(ctx_, partial, block_floats_);
  if (comm_) {
    kernels::reserve(ctx_, buf_.sending, block_floats_);
    kernels::reserve(ctx_, buf_.arriving, block_floats_);
  }
  kernels::fill(ctx_, dq, 0.0f);
  kernels::AttnShape probe{T, T, H, Hkv, D, 1.0f, causal_, 0, 0};
  note_workspace(buf_.cur.bytes() + buf_.nxt.bytes() + partial.bytes() + buf_.sending.bytes() +
                 buf_.arriving.bytes() + kernels::attention_workspace_bytes(probe, true));

  auto shapes = [&](const TokenRun& qr, const TokenRun& kr, kernels::AttnShape* s,
                    kernels::AttnShape* host,
                    int64_t* pairs) { return pair_shapes(qr, kr, H, Hkv, D, s, host, pairs); };
  Request dkv_send, dkv_recv;
  for (int step = 0; step < cp_size_; ++step) {
    KvTransfer kv = post_kv(step);
    // The partial is zeroed by the step's first kernel call: under packing
    // or a window many steps have none, and then neither zeroing nor the
    // sum in pass_dkv is needed (except for the own block, which starts the
    // accumulator's journey).
    bool touched = false;
    {
      ComputeSpan span_of_step(sink_, "ring.backward", step);
      const Tensor cur = buf_.cur;
      for_each_pair(
          (*call_runs_)[size_t(source_rank(step))], (*call_runs_)[size_t(cp_rank_)], shapes,
          [&](const TokenRun& qr, const TokenRun& kr, const kernels::AttnShape& s,
              const kernels::AttnShape& host, int64_t pairs) {
            const int64_t qo = qr.local_offset * H * D, ko = kr.local_offset * Hkv * D;
            const int64_t nqt = qr.length * H * D, nkt = kr.length * Hkv * D;
            if (!touched) kernels::fill(ctx_, span(partial, 0, block_floats_), 0.0f);
            touched = true;
            kernels::attention_backward(ctx_, s, span(q, qo, nqt), span(cur, ko, nkt),
                                        span(cur, nkv + ko, nkt), span(out, qo, nqt),
                                        span(lse, qr.local_offset * H, qr.length * H),
                                        span(dout, qo, nqt), span(dq, qo, nqt),
                                        span(partial, ko, nkt), span(partial, nkv + ko, nkt));
            if (sink_) span_of_step.flops += call_flops(host, pairs, true);
          },
          // The previous step's dK/dV accumulator is in flight too.
          [&] {
            span_of_step.drive_progress(comm_, {&kv.recv, &kv.send, &dkv_recv, &dkv_send});
          });
      if (!touched && step == 0) kernels::fill(ctx_, span(partial, 0, block_floats_), 0.0f);
    }
    if (comm_) pass_dkv(step, touched, dkv_send, dkv_recv);
    take_kv(step, kv);
  }
  const Tensor& own = comm_ ? buf_.arriving : partial;
  if (comm_) {
    timed_wait(dkv_recv);
    timed_wait(dkv_send);
  }
  Tensor dk_out = dk, dv_out = dv;
  kernels::copy(ctx_, dk_out, span(own, 0, nkv));
  kernels::copy(ctx_, dv_out, span(own, nkv, nkv));
  count("ring.calls", 1);
}

}  // namespace trident::cp
