// Ring attention of cp = 2 and 4 virtual ranks on one GPU equals the
// one-rank attention, forward and backward, for the contiguous and the
// zig-zag layout (fp32, 1e-5).
//
// Each virtual rank owns its tokens' Q, O, LSE, dO and dQ and one travelling
// slot with a K/V block (and, in the backward, that block's dK/dV). In step s
// rank r holds the block of rank (r - s) mod cp; after the step every slot is
// copied into the next rank's receive buffer in device memory, the
// in-process stand-in for the send/recv of the real ring. The forward
// continues each rank's (O, LSE) with attention_forward_resume; the backward
// adds into dQ locally and into the travelling dK/dV, which are back at their
// owner after cp steps.
#include <limits>
#include <memory>

#include "harness.hpp"
#include "trident/kernels/attention.hpp"

using trident::kernels::AttnShape;
using namespace gpu_test;

namespace {

struct Run {
  int64_t pos0, len, offset;  // global first position, tokens, row in the rank's buffer
};

std::vector<Run> runs_of(int rank, int cp, int64_t chunk, bool zigzag) {
  if (!zigzag) return {{rank * 2 * chunk, 2 * chunk, 0}};
  return {{rank * chunk, chunk, 0}, {(2 * cp - 1 - rank) * chunk, chunk, chunk}};
}

struct Problem {
  int H = 4, Hkv = 2, D = 64;
  int64_t S = 0;
  std::vector<float> q, k, v, dout;
  int64_t qrow() const { return int64_t(H) * D; }
  int64_t kvrow() const { return int64_t(Hkv) * D; }
};

struct Result {
  std::vector<float> out, lse, dq, dk, dv;
};

AttnShape pair_shape(const Problem& p, const Run& qr, const Run& kr) {
  AttnShape s;
  s.Tq = qr.len;
  s.Tk = kr.len;
  s.H = p.H;
  s.Hkv = p.Hkv;
  s.D = p.D;
  s.scale = 1.0f / std::sqrt(float(p.D));
  s.causal = true;
  s.q_pos0 = qr.pos0;
  s.k_pos0 = kr.pos0;
  return s;
}

Result one_rank(cuda::StreamContext& dc, const Problem& p) {
  AttnShape s = pair_shape(p, {0, p.S, 0}, {0, p.S, 0});
  Buf<float> q(dc, p.q), k(dc, p.k), v(dc, p.v), dout(dc, p.dout);
  Buf<float> o(dc, p.q.size()), l(dc, static_cast<size_t>(p.S * p.H)), dq(dc, p.q.size()),
      dk(dc, p.k.size()), dv(dc, p.v.size());
  cuda::attention_forward(dc.ctx(), s, q, k, v, o, l);
  cuda::attention_backward(dc.ctx(), s, q, k, v, o, l, dout, dq, dk, dv);
  return {o.host(), l.host(), dq.host(), dk.host(), dv.host()};
}

// The rows of `global` ([S, width]) that a rank's runs hold, in its order.
std::vector<float> local_rows(const std::vector<float>& global, const std::vector<Run>& runs,
                              int64_t width) {
  std::vector<float> out;
  for (const Run& r : runs)
    out.insert(out.end(), global.begin() + r.pos0 * width,
               global.begin() + (r.pos0 + r.len) * width);
  return out;
}

void put_rows(std::vector<float>& global, const std::vector<float>& local,
              const std::vector<Run>& runs, int64_t width) {
  for (const Run& r : runs)
    std::copy(local.begin() + r.offset * width, local.begin() + (r.offset + r.len) * width,
              global.begin() + r.pos0 * width);
}

struct Rank {
  std::vector<Run> runs;
  std::unique_ptr<Buf<float>> q, o, l, dout, dq;
  // The travelling slot and its receive buffer: k, v, dk, dv of one block.
  std::unique_ptr<Buf<float>> slot[4], recv[4];
  int holds = 0;  // whose block is in the slot
};

void pass_slots(cuda::StreamContext& dc, std::vector<Rank>& ranks) {
  const int cp = int(ranks.size());
  for (int r = 0; r < cp; ++r) {
    Rank& next = ranks[static_cast<size_t>((r + 1) % cp)];
    for (int b = 0; b < 4; ++b)
      cuda::copy_device(dc.ctx(), next.recv[b]->get(), ranks[static_cast<size_t>(r)].slot[b]->get(),
                        next.recv[b]->size() * sizeof(float));
  }
  std::vector<int> held(static_cast<size_t>(cp));
  for (int r = 0; r < cp; ++r)
    held[static_cast<size_t>((r + 1) % cp)] = ranks[static_cast<size_t>(r)].holds;
  for (int r = 0; r < cp; ++r) {
    for (int b = 0; b < 4; ++b)
      std::swap(ranks[static_cast<size_t>(r)].slot[b], ranks[static_cast<size_t>(r)].recv[b]);
    ranks[static_cast<size_t>(r)].holds = held[static_cast<size_t>(r)];
  }
}

// One ring step's attention calls: every (query run, key run) pair.
template <class Call>
void for_pairs(const Problem& p, const std::vector<Rank>& ranks, Call&& call) {
  for (const Rank& me : ranks)
    for (const Run& qr : me.runs)
      for (const Run& kr : ranks[static_cast<size_t>(me.holds)].runs)
        call(me, qr, kr, pair_shape(p, qr, kr));
}

Result ring(cuda::StreamContext& dc, const Problem& p, int cp, bool zigzag) {
  const int64_t chunk = p.S / (2 * cp), local = 2 * chunk;
  std::vector<Rank> ranks(static_cast<size_t>(cp));
  const std::vector<float> minus_inf(static_cast<size_t>(local * p.H),
                                     -std::numeric_limits<float>::infinity());
  for (int r = 0; r < cp; ++r) {
    Rank& me = ranks[static_cast<size_t>(r)];
    me.runs = runs_of(r, cp, chunk, zigzag);
    me.holds = r;
    me.q = std::make_unique<Buf<float>>(dc, local_rows(p.q, me.runs, p.qrow()));
    me.dout = std::make_unique<Buf<float>>(dc, local_rows(p.dout, me.runs, p.qrow()));
    me.o = std::make_unique<Buf<float>>(dc, static_cast<size_t>(local * p.qrow()));
    me.dq = std::make_unique<Buf<float>>(dc, static_cast<size_t>(local * p.qrow()));
    me.l = std::make_unique<Buf<float>>(dc, minus_inf);
    me.slot[0] = std::make_unique<Buf<float>>(dc, local_rows(p.k, me.runs, p.kvrow()));
    me.slot[1] = std::make_unique<Buf<float>>(dc, local_rows(p.v, me.runs, p.kvrow()));
    for (int b = 2; b < 4; ++b)
      me.slot[b] = std::make_unique<Buf<float>>(dc, static_cast<size_t>(local * p.kvrow()));
    for (int b = 0; b < 4; ++b)
      me.recv[b] = std::make_unique<Buf<float>>(dc, static_cast<size_t>(local * p.kvrow()));
  }
  for (int step = 0; step < cp; ++step) {
    for_pairs(p, ranks, [&](const Rank& me, const Run& qr, const Run& kr, const AttnShape& s) {
      cuda::attention_forward_resume(
          dc.ctx(), s, me.q->get() + qr.offset * p.qrow(),
          me.slot[0]->get() + kr.offset * p.kvrow(), me.slot[1]->get() + kr.offset * p.kvrow(),
          me.o->get() + qr.offset * p.qrow(), me.l->get() + qr.offset * p.H);
    });
    pass_slots(dc, ranks);
  }
  for (int step = 0; step < cp; ++step) {
    for_pairs(p, ranks, [&](const Rank& me, const Run& qr, const Run& kr, const AttnShape& s) {
      const int64_t qo = qr.offset * p.qrow(), ko = kr.offset * p.kvrow();
      cuda::attention_backward(dc.ctx(), s, me.q->get() + qo, me.slot[0]->get() + ko,
                               me.slot[1]->get() + ko, me.o->get() + qo,
                               me.l->get() + qr.offset * p.H, me.dout->get() + qo,
                               me.dq->get() + qo, me.slot[2]->get() + ko, me.slot[3]->get() + ko);
    });
    pass_slots(dc, ranks);
  }
  Result res{std::vector<float>(p.q.size()), std::vector<float>(static_cast<size_t>(p.S * p.H)),
             std::vector<float>(p.q.size()), std::vector<float>(p.k.size()),
             std::vector<float>(p.v.size())};
  for (const Rank& me : ranks) {
    expect(me.holds == int(&me - ranks.data()), "blocks are back at their owners");
    put_rows(res.out, me.o->host(), me.runs, p.qrow());
    put_rows(res.lse, me.l->host(), me.runs, p.H);
    put_rows(res.dq, me.dq->host(), me.runs, p.qrow());
    put_rows(res.dk, me.slot[2]->host(), me.runs, p.kvrow());
    put_rows(res.dv, me.slot[3]->host(), me.runs, p.kvrow());
  }
  return res;
}

}  // namespace

GPU_TEST("ring attention cp 2 and 4, contiguous and zig-zag, equals one rank") {
  for (int cp : {2, 4}) {
    Problem p;
    p.S = 2 * cp * 37;  // chunks of 37 tokens: no tile divides them
    p.q = randn(static_cast<size_t>(p.S * p.qrow()), "ring q");
    p.k = randn(static_cast<size_t>(p.S * p.kvrow()), "ring k");
    p.v = randn(static_cast<size_t>(p.S * p.kvrow()), "ring v");
    p.dout = randn(static_cast<size_t>(p.S * p.qrow()), "ring dout");
    const Result want = one_rank(dc, p);
    for (bool zigzag : {false, true}) {
      const std::string tag = "cp " + std::to_string(cp) + (zigzag ? " zigzag" : " contiguous");
      const Result got = ring(dc, p, cp, zigzag);
      check_close(tag + " out", got.out, want.out, 1e-5);
      check_close(tag + " lse", got.lse, want.lse, 1e-5);
      check_close(tag + " dq", got.dq, want.dq, 1e-5);
      check_close(tag + " dk", got.dk, want.dk, 1e-5);
      check_close(tag + " dv", got.dv, want.dv, 1e-5);
    }
  }
}
