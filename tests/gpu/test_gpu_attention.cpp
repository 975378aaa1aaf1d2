// CUDA flash attention against the CPU reference (kernels/cpu/attention.cpp):
// forward (output and LSE) and backward (dQ, dK, dV accumulated onto random
// values), causal and full, GQA, sequences that are not multiples of any
// tile, offset positions, fully masked rows (0 output, -inf LSE, no NaN),
// head dims 16..256, the resume and merge that ring attention uses, and
// bf16 storage (tolerances: harness.hpp; gradients that accumulate onto
// random values are compared by their increments).
#include <limits>

#include "attention_cases.hpp"
#include "harness.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/kernels/backends.hpp"

namespace cpu = trident::kernels;
// The CPU reference implementations, called directly (this build may have no
// routing layer), with a host Ctx.
namespace ref = trident::kernels::cpu;
const trident::kernels::Ctx kHost{};
using trident::kernels::AttnShape;
using namespace gpu_test;

namespace {

// Packed documents: the CPU reference reads host ids, the GPU the same ids
// in device memory.
struct Docs {
  std::vector<int32_t> q, k;
};

void check_fp32(cuda::StreamContext& dc, const AttnShape& host_shape, const Docs& docs = {}) {
  AttnShape s = host_shape;
  if (!docs.q.empty()) {
    s.q_doc = docs.q.data();
    s.k_doc = docs.k.data();
  }
  const std::string tag =
      name_of(s) + " window " + std::to_string(s.window) + (docs.q.empty() ? "" : " documents");
  const Inputs in = inputs(s, false);
  std::vector<float> out(in.q.size()), lse(static_cast<size_t>(s.Tq * s.H));
  ref::attention_forward(kHost, s, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
  Buf<float> q(dc, in.q), k(dc, in.k), v(dc, in.v), o(dc, out.size()), l(dc, lse.size());
  Buf<int32_t> qd(dc, docs.q.empty() ? std::vector<int32_t>{0} : docs.q),
      kd(dc, docs.k.empty() ? std::vector<int32_t>{0} : docs.k);
  AttnShape ds = s;  // the device's view of the same shape
  if (!docs.q.empty()) {
    ds.q_doc = qd;
    ds.k_doc = kd;
  }
  cuda::attention_forward(dc.ctx(), ds, q, k, v, o, l);
  const auto got_out = o.host();
  check_close("fwd out " + tag, got_out, out, 1e-5);
  check_close("fwd lse " + tag, l.host(), lse, 1e-5);

  auto dq = in.dq0, dk = in.dk0, dv = in.dv0;
  ref::attention_backward(kHost, s, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(),
                          in.dout.data(), dq.data(), dk.data(), dv.data());
  Buf<float> dout(dc, in.dout), gdq(dc, in.dq0), gdk(dc, in.dk0), gdv(dc, in.dv0);
  cuda::attention_backward(dc.ctx(), ds, q, k, v, o, l, dout, gdq, gdk, gdv);
  check_increment("bwd dq " + tag, gdq.host(), dq, in.dq0, 1e-5);
  check_increment("bwd dk " + tag, gdk.host(), dk, in.dk0, 1e-5);
  check_increment("bwd dv " + tag, gdv.host(), dv, in.dv0, 1e-5);
}

std::vector<int32_t> doc_ids(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> ids;
  for (size_t d = 0; d < lengths.size(); ++d)
    ids.insert(ids.end(), static_cast<size_t>(lengths[d]), int32_t(d));
  return ids;
}

}  // namespace

GPU_TEST("attention fp32 against the CPU: shapes, GQA, tile remainders, offsets") {
  check_fp32(dc, shape(77, 77, 4, 2, 16, true));
  check_fp32(dc, shape(300, 300, 2, 1, 64, false));
  check_fp32(dc, shape(130, 200, 4, 4, 128, true, 100, 0));
  check_fp32(dc, shape(33, 65, 6, 2, 96, true, 64, 0));
  check_fp32(dc, shape(40, 40, 2, 1, 256, true));
  check_fp32(dc, shape(1, 1, 1, 1, 8, true));
  check_fp32(dc, shape(17, 500, 8, 1, 32, false));
}

GPU_TEST("attention fully masked rows: 0 output, -inf LSE, no NaN anywhere") {
  // Keys start at position 20, queries at 0: query rows 0..19 see nothing.
  const AttnShape s = shape(50, 40, 3, 1, 64, true, 0, 20);
  check_fp32(dc, s);
  const Inputs in = inputs(s, false);
  Buf<float> q(dc, in.q), k(dc, in.k), v(dc, in.v), o(dc, in.q.size()),
      l(dc, static_cast<size_t>(s.Tq * s.H));
  cuda::attention_forward(dc.ctx(), s, q, k, v, o, l);
  const auto out = o.host(), lse = l.host();
  for (int64_t i = 0; i < 20; ++i)
    for (int h = 0; h < s.H; ++h) {
      expect(lse[static_cast<size_t>(i * s.H + h)] == -std::numeric_limits<float>::infinity(),
             "row " + std::to_string(i) + " LSE is -inf");
      for (int d = 0; d < s.D; ++d)
        expect(out[static_cast<size_t>((i * s.H + h) * s.D + d)] == 0.0f, "masked row output is 0");
    }
  // Every row masked (keys entirely in the future): a ring step below the diagonal.
  const AttnShape all = shape(30, 30, 2, 2, 32, true, 0, 100);
  check_fp32(dc, all);
}

GPU_TEST("attention with packed documents and sliding windows against the CPU") {
  // Documents of length 1, on tile edges and across tiles; a ring-like step
  // whose queries meet only one of the keys' documents (rows without keys).
  const Docs packed{doc_ids({1, 15, 16, 32, 1, 100, 135}), doc_ids({1, 15, 16, 32, 1, 100, 135})};
  check_fp32(dc, shape(300, 300, 4, 2, 64, true), packed);
  check_fp32(dc, shape(300, 300, 2, 2, 128, false), packed);
  Docs step{std::vector<int32_t>(120, 5), doc_ids({10, 50, 3, 37})};
  for (int i = 0; i < 40; ++i) step.q[size_t(i)] = 3;
  check_fp32(dc, shape(120, 100, 2, 1, 32, true, 200, 0), step);
  for (int64_t w : {1, 16, 33, 100, 400}) {
    AttnShape s = shape(260, 260, 2, 1, 64, true);
    s.window = w;
    check_fp32(dc, s);
    check_fp32(dc, s, Docs{doc_ids({40, 1, 219}), doc_ids({40, 1, 219})});
    AttnShape r = shape(100, 300, 2, 1, 64, true, 300, 0);
    r.window = w;
    check_fp32(dc, r);
  }
}

GPU_TEST("attention resume and merge over split key sets equal one pass") {
  const AttnShape full = shape(150, 150, 4, 2, 64, true);
  const Inputs in = inputs(full, false);
  Buf<float> q(dc, in.q), k(dc, in.k), v(dc, in.v);
  Buf<float> o(dc, in.q.size()), l(dc, static_cast<size_t>(full.Tq * full.H));
  cuda::attention_forward(dc.ctx(), full, q, k, v, o, l);
  const int64_t split = 61, kv_row = int64_t(full.Hkv) * full.D;
  AttnShape a = full, b = full;
  a.Tk = split;
  b.Tk = full.Tk - split;
  b.k_pos0 = split;
  // Resume: seeded with -inf / 0, the first half, then the second.
  std::vector<float> lse0(static_cast<size_t>(full.Tq * full.H),
                          -std::numeric_limits<float>::infinity());
  Buf<float> ro(dc, in.q.size()), rl(dc, lse0);
  cuda::attention_forward_resume(dc.ctx(), a, q, k, v, ro, rl);
  cuda::attention_forward_resume(dc.ctx(), b, q, k.get() + split * kv_row, v.get() + split * kv_row,
                                 ro, rl);
  check_close("resume out", ro.host(), o.host(), 1e-5);
  check_close("resume lse", rl.host(), l.host(), 1e-5);
  // Merge: two partial forwards, merged.
  Buf<float> mo(dc, in.q.size()), ml(dc, lse0.size()), bo(dc, in.q.size()), bl(dc, lse0.size());
  cuda::attention_forward(dc.ctx(), a, q, k, v, mo, ml);
  cuda::attention_forward(dc.ctx(), b, q, k.get() + split * kv_row, v.get() + split * kv_row, bo,
                          bl);
  cuda::merge_partial_attention(dc.ctx(), full.Tq * full.H, full.D, mo, ml, bo, bl);
  check_close("merge out", mo.host(), o.host(), 1e-5);
  check_close("merge lse", ml.host(), l.host(), 1e-5);
  // The CPU merge of the same GPU partials agrees too.
  cuda::attention_forward(dc.ctx(), a, q, k, v, mo, ml);
  auto ao = mo.host(), al = ml.host();
  const auto bo_h = bo.host(), bl_h = bl.host();
  ref::merge_partial_attention(kHost, full.Tq * full.H, full.D, ao.data(), al.data(), bo_h.data(),
                               bl_h.data());
  check_close("cpu merge of gpu partials", ao, o.host(), 1e-5);
}

GPU_TEST("attention bf16 storage against the fp32 CPU reference") {
  // D 64 and 128 run on tensor cores (attention_tc.cu), D 96 on CUDA cores;
  // the third shape has fully masked rows (keys start at position 20).
  for (const AttnShape& s : {shape(200, 200, 4, 2, 128, true), shape(96, 160, 2, 2, 64, false),
                             shape(50, 40, 3, 1, 64, true, 0, 20), shape(70, 70, 2, 1, 96, true)}) {
    const std::string tag = name_of(s);
    const Inputs in = inputs(s, true);
    std::vector<float> out(in.q.size()), lse(static_cast<size_t>(s.Tq * s.H));
    ref::attention_forward(kHost, s, in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data());
    Buf<cuda::Bf16> q(dc, to_bits(in.q)), k(dc, to_bits(in.k)), v(dc, to_bits(in.v)),
        o(dc, out.size()), dout(dc, to_bits(in.dout));
    Buf<float> l(dc, lse.size());
    cuda::attention_forward_bf16(dc.ctx(), s, q, k, v, o, l);
    check_close("bf16 fwd out " + tag, from_bits(o.host()), out, kBf16Attention);
    check_close("bf16 fwd lse " + tag, l.host(), lse, 1e-5);
    // The backward from the bf16 output, against the CPU's from the same.
    const auto out16 = from_bits(o.host());
    const auto lse16 = l.host();
    auto dq = in.dq0, dk = in.dk0, dv = in.dv0;
    ref::attention_backward(kHost, s, in.q.data(), in.k.data(), in.v.data(), out16.data(),
                            lse16.data(), in.dout.data(), dq.data(), dk.data(), dv.data());
    Buf<float> gdq(dc, in.dq0), gdk(dc, in.dk0), gdv(dc, in.dv0);
    cuda::attention_backward_bf16(dc.ctx(), s, q, k, v, o, l, dout, gdq, gdk, gdv);
    // fp32 gradients from the same bf16 operands on both sides: fp32's bound.
    check_increment("bf16 bwd dq " + tag, gdq.host(), dq, in.dq0, 1e-5);
    check_increment("bf16 bwd dk " + tag, gdk.host(), dk, in.dk0, 1e-5);
    check_increment("bf16 bwd dv " + tag, gdv.host(), dv, in.dv0, 1e-5);
  }
}

GPU_TEST("attention bf16 resume over split key sets equals one pass") {
  for (int D : {64, 128, 96}) {
    const AttnShape full = shape(140, 140, 4, 2, D, true);
    const Inputs in = inputs(full, true);
    Buf<cuda::Bf16> q(dc, to_bits(in.q)), k(dc, to_bits(in.k)), v(dc, to_bits(in.v));
    Buf<cuda::Bf16> o(dc, in.q.size()), ro(dc, in.q.size());
    Buf<float> l(dc, static_cast<size_t>(full.Tq * full.H));
    cuda::attention_forward_bf16(dc.ctx(), full, q, k, v, o, l);
    const int64_t split = 77, kv_row = int64_t(full.Hkv) * full.D;
    AttnShape a = full, b = full;
    a.Tk = split;
    b.Tk = full.Tk - split;
    b.k_pos0 = split;
    std::vector<float> lse0(static_cast<size_t>(full.Tq * full.H),
                            -std::numeric_limits<float>::infinity());
    Buf<float> rl(dc, lse0);
    cuda::attention_forward_resume_bf16(dc.ctx(), a, q, k, v, ro, rl);
    cuda::attention_forward_resume_bf16(dc.ctx(), b, q, k.get() + split * kv_row,
                                        v.get() + split * kv_row, ro, rl);
    const std::string tag = "D " + std::to_string(D);
    check_close("bf16 resume out " + tag, from_bits(ro.host()), from_bits(o.host()), kBf16Resumed);
    check_close("bf16 resume lse " + tag, rl.host(), l.host(), 1e-5);
  }
}
