// The tuned CPU flash attention (kernels/cpu/attention.cpp) against the plain
// reference beside it (kernels/cpu/attention_reference.cpp: whole score rows
// accumulated in fp64), on random inputs with an asserted relative tolerance.
// Outputs, LSE and all three gradients; causal and not, GQA, tile
// remainders, offset positions and fully masked rows.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "kernel_ctx.hpp"
#include "reference.hpp"
#include "trident/core/rng.hpp"
#include "trident/core/tensor.hpp"
#include "trident/kernels/attention.hpp"

using trident::kernels::AttnShape;

namespace {

std::vector<float> random_vec(int64_t n, const char* name, float scale = 1.0f) {
  std::vector<float> x(static_cast<size_t>(n));
  trident::rng::fill_normal(x.data(), n, trident::rng::hash_name(name), 0, scale);
  return x;
}

// The plain reference kernels beside the tuned ones (kernels/cpu/reference.hpp):
// whole score rows in fp64, no tiling.
struct Reference {
  std::vector<float> out, lse, dq, dk, dv;
};

// The mask's definition, written out (q_doc / k_doc are host memory here).
bool visible(const AttnShape& s, int64_t i, int64_t j) {
  const int64_t qp = s.q_pos0 + i, kp = s.k_pos0 + j;
  if (s.causal && kp > qp) return false;
  if (s.window > 0 && qp - kp >= s.window) return false;
  return s.q_doc == nullptr || s.q_doc[i] == s.k_doc[j];
}

Reference naive_attention(const AttnShape& s, const std::vector<float>& q,
                          const std::vector<float>& k, const std::vector<float>& v,
                          const std::vector<float>& dout) {
  namespace ref = trident::kernels::cpu::reference;
  Reference r;
  r.out.assign(q.size(), 0.0f);
  r.lse.assign(size_t(s.Tq * s.H), 0.0f);
  r.dq.assign(q.size(), 0.0f);
  r.dk.assign(k.size(), 0.0f);
  r.dv.assign(v.size(), 0.0f);
  ref::attention_forward(s, q.data(), k.data(), v.data(), r.out.data(), r.lse.data());
  ref::attention_backward(s, q.data(), k.data(), v.data(), dout.data(), r.dq.data(), r.dk.data(),
                          r.dv.data());
  return r;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i])) continue;  // compared separately
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  if (std::isnan(num)) return INFINITY;
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

bool all_finite(const std::vector<float>& x) {
  for (float f : x)
    if (!std::isfinite(f)) return false;
  return true;
}

// poison: keys that no query sees get NaN in K and V, so a kernel that
// computed any of them (rather than skipping them) would return NaN. (In a
// self-attention call every key sees itself; the calls of a ring step have
// such keys.)
void check_against_reference(const AttnShape& s, bool poison = false) {
  const int64_t nq = s.Tq * s.H * s.D, nk = s.Tk * s.Hkv * s.D;
  auto q = random_vec(nq, "q"), k = random_vec(nk, "k"), v = random_vec(nk, "v");
  int64_t poisoned = 0;
  for (int64_t j = 0; poison && j < s.Tk; ++j) {
    bool seen = false;
    for (int64_t i = 0; i < s.Tq && !seen; ++i) seen = visible(s, i, j);
    if (seen) continue;
    ++poisoned;
    for (int64_t e = 0; e < s.Hkv * s.D; ++e)
      k[size_t(j * s.Hkv * s.D + e)] = v[size_t(j * s.Hkv * s.D + e)] = NAN;
  }
  if (poison) REQUIRE(poisoned > 0);
  auto dout = random_vec(nq, "dout");
  std::vector<float> out(static_cast<size_t>(nq)), lse(static_cast<size_t>(s.Tq * s.H));
  trident::kernels::attention_forward(trident::test::kernel_ctx(), s, q.data(), k.data(), v.data(),
                                      out.data(), lse.data());
  // Gradients accumulate: start from a random value and subtract it after.
  auto dq0 = random_vec(nq, "dq0"), dk0 = random_vec(nk, "dk0"), dv0 = random_vec(nk, "dv0");
  auto dq = dq0, dk = dk0, dv = dv0;
  trident::kernels::attention_backward(trident::test::kernel_ctx(), s, q.data(), k.data(), v.data(),
                                       out.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                                       dv.data());
  for (size_t i = 0; i < dq.size(); ++i) dq[i] -= dq0[i];
  for (size_t i = 0; i < dk.size(); ++i) dk[i] -= dk0[i], dv[i] -= dv0[i];
  if (poison) {  // the reference gets finite numbers where the kernel must not look
    for (float& x : k)
      if (std::isnan(x)) x = 0.0f;
    for (float& x : v)
      if (std::isnan(x)) x = 0.0f;
  }

  const Reference ref = naive_attention(s, q, k, v, dout);
  CHECK(all_finite(out));
  CHECK(all_finite(dq));
  CHECK(all_finite(dk));
  CHECK(all_finite(dv));
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      REQUIRE(lse[i] == -std::numeric_limits<float>::infinity());
      for (int d = 0; d < s.D; ++d) REQUIRE(out[i * s.D + d] == 0.0f);
    } else {
      REQUIRE(std::isfinite(lse[i]));
    }
  }
  CHECK(rel_l2(out, ref.out) <= 1e-5);
  CHECK(rel_l2(lse, ref.lse) <= 1e-5);
  CHECK(rel_l2(dq, ref.dq) <= 1e-5);
  CHECK(rel_l2(dk, ref.dk) <= 1e-5);
  CHECK(rel_l2(dv, ref.dv) <= 1e-5);
}

AttnShape shape(int64_t Tq, int64_t Tk, int H, int Hkv, int D, bool causal, int64_t qp = 0,
                int64_t kp = 0) {
  AttnShape s;
  s.Tq = Tq, s.Tk = Tk, s.H = H, s.Hkv = Hkv, s.D = D;
  s.scale = 1.0f / std::sqrt(float(D));
  s.causal = causal, s.q_pos0 = qp, s.k_pos0 = kp;
  return s;
}

}  // namespace

TEST_CASE("attention matches the naive reference, non-causal, tile remainders") {
  // 300 = 2 query tiles + 44 rows, 1 key tile + 44 columns.
  check_against_reference(shape(300, 300, 3, 3, 64, false));
}

TEST_CASE("attention matches the naive reference, causal") {
  check_against_reference(shape(300, 300, 2, 2, 64, true));
  check_against_reference(shape(517, 517, 1, 1, 32, true));
}

TEST_CASE("attention at the tile edges: lengths kKeyBlock*m + 1 and kKeyBlock*m - 1",
          "[boundary]") {
  using trident::kernels::kKeyBlock;
  using trident::kernels::kQueryBlock;
  static_assert(kKeyBlock % kQueryBlock == 0, "the lengths below assume nested tiles");
  // kKeyBlock*m + 1: the last query block is one row, and its only query's own key
  // is the first key of a new tile (a tile whose first key equals the block's
  // last query must be computed, not skipped). kKeyBlock*m - 1: the last tile and
  // the last query block each end one short of a full tile.
  for (int64_t m : {1, 2}) {
    INFO("m = " << m);
    check_against_reference(shape(kKeyBlock * m + 1, kKeyBlock * m + 1, 2, 1, 16, true));
    check_against_reference(shape(kKeyBlock * m - 1, kKeyBlock * m - 1, 2, 1, 16, true));
  }
  check_against_reference(shape(kKeyBlock + 1, kKeyBlock + 1, 2, 2, 8, false));
}

TEST_CASE("a query that sees exactly one key", "[boundary]") {
  using trident::kernels::kKeyBlock;
  // The keys start at the query's position: the query sees the first key only.
  check_against_reference(shape(1, 300, 2, 1, 16, true, 500, 500));
  // One query at position kKeyBlock against keys 0..kKeyBlock+43: its last
  // visible key is the first of the second key tile, alone in that tile.
  check_against_reference(shape(1, kKeyBlock + 44, 2, 2, 16, true, kKeyBlock, 0));
  // Keys from position kKeyBlock on, of a later run: queries 0..kKeyBlock-1
  // see none, query kKeyBlock sees one.
  check_against_reference(shape(kKeyBlock + 1, 40, 1, 1, 8, true, 0, kKeyBlock));
  CHECK(trident::kernels::attention_visible_pairs(shape(1, 300, 2, 1, 16, true, 500, 500)) == 2);
  CHECK(trident::kernels::attention_visible_pairs(
            shape(kKeyBlock + 1, 40, 1, 1, 8, true, 0, kKeyBlock)) == 1);
}

TEST_CASE("attention matches the naive reference, grouped-query heads") {
  check_against_reference(shape(200, 200, 8, 2, 32, true));
  check_against_reference(shape(130, 270, 6, 3, 16, false));
  check_against_reference(shape(97, 97, 4, 1, 24, true));
}

TEST_CASE("attention with offset positions (a later query run against an earlier key run)") {
  // Queries at 400..529 against keys 0..516: the diagonal cuts the key range.
  check_against_reference(shape(130, 517, 2, 1, 20, true, 400, 0));
  // Keys entirely in the past: every tile is full.
  check_against_reference(shape(70, 300, 2, 2, 32, true, 1000, 0));
}

TEST_CASE("fully masked rows give zero output, LSE -inf, zero gradients, no NaN") {
  // Keys start at position 50: queries 0..49 see nothing.
  check_against_reference(shape(120, 90, 2, 1, 16, true, 0, 50));
  // No query sees anything at all.
  const AttnShape s = shape(40, 40, 2, 2, 8, true, 0, 100);
  auto q = random_vec(40 * 2 * 8, "q"), k = random_vec(40 * 2 * 8, "k"), v = random_vec(640, "v");
  auto dout = random_vec(640, "dout");
  std::vector<float> out(640, 1.0f), lse(80, 1.0f), dq(640, 0.0f), dk(640, 0.0f), dv(640, 0.0f);
  trident::kernels::attention_forward(trident::test::kernel_ctx(), s, q.data(), k.data(), v.data(),
                                      out.data(), lse.data());
  for (float x : out) REQUIRE(x == 0.0f);
  for (float x : lse) REQUIRE(x == -std::numeric_limits<float>::infinity());
  trident::kernels::attention_backward(trident::test::kernel_ctx(), s, q.data(), k.data(), v.data(),
                                       out.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                                       dv.data());
  for (size_t i = 0; i < 640; ++i) REQUIRE((dq[i] == 0.0f && dk[i] == 0.0f && dv[i] == 0.0f));
  CHECK(trident::kernels::attention_visible_pairs(s) == 0);
}

TEST_CASE("partial results over key halves merge to the full attention") {
  const AttnShape full = shape(150, 400, 4, 2, 32, true, 250, 0);
  auto q = random_vec(150 * 4 * 32, "q"), k = random_vec(400 * 2 * 32, "k");
  auto v = random_vec(400 * 2 * 32, "v");
  std::vector<float> out(q.size()), lse(150 * 4);
  trident::kernels::attention_forward(trident::test::kernel_ctx(), full, q.data(), k.data(),
                                      v.data(), out.data(), lse.data());

  // Keys 0..299 and 300..399 (the second half is partly in the future of the
  // early queries, so some rows see nothing in it).
  AttnShape a = full, b = full;
  a.Tk = 300;
  b.Tk = 100, b.k_pos0 = 300;
  std::vector<float> out_a(q.size()), lse_a(lse.size()), out_b(q.size()), lse_b(lse.size());
  trident::kernels::attention_forward(trident::test::kernel_ctx(), a, q.data(), k.data(), v.data(),
                                      out_a.data(), lse_a.data());
  trident::kernels::attention_forward(trident::test::kernel_ctx(), b, q.data(), k.data() + 300 * 64,
                                      v.data() + 300 * 64, out_b.data(), lse_b.data());
  int64_t empty_rows = 0;
  for (float x : lse_b) empty_rows += std::isinf(x);
  REQUIRE(empty_rows > 0);  // the -inf path of the merge is exercised
  // Merge in the order b then a, starting from "nothing seen".
  std::vector<float> m_out(q.size(), 0.0f), m_lse(lse.size(), -INFINITY);
  trident::kernels::merge_partial_attention(trident::test::kernel_ctx(), 150 * 4, 32, m_out.data(),
                                            m_lse.data(), out_b.data(), lse_b.data());
  trident::kernels::merge_partial_attention(trident::test::kernel_ctx(), 150 * 4, 32, m_out.data(),
                                            m_lse.data(), out_a.data(), lse_a.data());
  CHECK(trident::rel_l2_diff(m_out.data(), out.data(), int64_t(out.size())) <= 1e-5);
  CHECK(trident::rel_l2_diff(m_lse.data(), lse.data(), int64_t(lse.size())) <= 1e-5);

  // The same through attention_forward_resume (the merge fused into the
  // kernel), in both orders: the rows that see nothing of b must come out of
  // the b call as "nothing seen" in one order and unchanged in the other.
  for (bool b_first : {true, false}) {
    std::vector<float> r_out(q.size(), 0.0f), r_lse(lse.size(), -INFINITY);
    for (int part = 0; part < 2; ++part) {
      const bool use_b = (part == 0) == b_first;
      const AttnShape& s = use_b ? b : a;
      const int64_t k0 = use_b ? 300 * 64 : 0;
      trident::kernels::attention_forward_resume(trident::test::kernel_ctx(), s, q.data(),
                                                 k.data() + k0, v.data() + k0, r_out.data(),
                                                 r_lse.data());
    }
    CHECK(trident::rel_l2_diff(r_out.data(), out.data(), int64_t(out.size())) <= 1e-5);
    CHECK(trident::rel_l2_diff(r_lse.data(), lse.data(), int64_t(lse.size())) <= 1e-5);
  }
}

TEST_CASE("the reference's gradient agrees with finite differences") {
  // Guards the reference itself: loss = sum(dout * out), perturb q, k, v.
  const AttnShape s = shape(9, 11, 2, 1, 4, true, 3, 0);
  auto q = random_vec(9 * 2 * 4, "q"), k = random_vec(11 * 4, "k"), v = random_vec(11 * 4, "v");
  auto dout = random_vec(9 * 2 * 4, "dout");
  const Reference r = naive_attention(s, q, k, v, dout);
  auto loss = [&](const std::vector<float>& qq, const std::vector<float>& kk,
                  const std::vector<float>& vv) {
    const Reference x = naive_attention(s, qq, kk, vv, dout);
    double l = 0;
    for (size_t i = 0; i < x.out.size(); ++i) l += x.out[i] * dout[i];
    return l;
  };
  const float h = 1e-2f;
  auto fd = [&](std::vector<float>& x, size_t i) {
    const float keep = x[i];
    x[i] = keep + h;
    double up = loss(q, k, v);
    x[i] = keep - h;
    double down = loss(q, k, v);
    x[i] = keep;
    return (up - down) / (2.0 * h);
  };
  for (size_t i = 0; i < q.size(); i += 5) CHECK(std::fabs(fd(q, i) - r.dq[i]) < 1e-3);
  for (size_t i = 0; i < k.size(); i += 3) CHECK(std::fabs(fd(k, i) - r.dk[i]) < 1e-3);
  for (size_t i = 0; i < v.size(); i += 3) CHECK(std::fabs(fd(v, i) - r.dv[i]) < 1e-3);
}

TEST_CASE("visible pairs and flops follow the causal mask") {
  CHECK(trident::kernels::attention_visible_pairs(shape(10, 10, 2, 2, 8, false)) == 200);
  CHECK(trident::kernels::attention_visible_pairs(shape(10, 10, 2, 2, 8, true)) == 110);
  CHECK(trident::kernels::attention_visible_pairs(shape(4, 10, 1, 1, 8, true, 20, 0)) == 40);
  CHECK(trident::kernels::attention_flops(shape(10, 10, 1, 1, 8, false), false) == 4.0 * 8 * 100);
  CHECK_THROWS(trident::kernels::check_attn_shape(shape(10, 10, 3, 2, 8, false)));
}

namespace {

// Document ids of consecutive documents of the given lengths.
std::vector<int32_t> doc_ids(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> ids;
  for (size_t d = 0; d < lengths.size(); ++d) ids.insert(ids.end(), size_t(lengths[d]), int32_t(d));
  return ids;
}

// Random document lengths summing to n, drawn from the counter RNG (a long
// tail: most short, a few long), with some length-1 documents.
std::vector<int64_t> random_lengths(int64_t n, const char* name) {
  std::vector<float> u(64);
  trident::rng::fill_normal(u.data(), int64_t(u.size()), trident::rng::hash_name(name), 0, 1.0f);
  std::vector<int64_t> len;
  int64_t used = 0;
  for (size_t t = 0; used < n; ++t) {
    const float x = u[t % u.size()];
    int64_t l = t % 5 == 2 ? 1 : int64_t(std::exp(2.5f + 1.5f * x)) + 1;
    l = std::min(l, n - used);
    len.push_back(l);
    used += l;
  }
  return len;
}

}  // namespace

TEST_CASE("document masks match the naive reference", "[documents]") {
  // Two key tiles and 188 keys; the last query tile is partial too.
  const int64_t T = 2 * trident::kernels::kKeyBlock + 188;
  SECTION("random long-tailed lengths, GQA") {
    const auto ids = doc_ids(random_lengths(T, "doc lengths"));
    AttnShape s = shape(T, T, 4, 2, 32, true);
    s.q_doc = s.k_doc = ids.data();
    check_against_reference(s);
  }
  SECTION("boundaries on query and key tile edges, a length-1 document, one long document") {
    const auto ids =
        doc_ids({trident::kernels::kQueryBlock, 1,
                 trident::kernels::kKeyBlock - trident::kernels::kQueryBlock - 1,
                 trident::kernels::kKeyBlock, 1, T - 2 * trident::kernels::kKeyBlock - 1});
    AttnShape s = shape(T, T, 2, 2, 16, true);
    s.q_doc = s.k_doc = ids.data();
    check_against_reference(s);
  }
  SECTION("every token its own document") {
    std::vector<int32_t> ids(size_t(300));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    AttnShape s = shape(300, 300, 2, 1, 8, true);
    s.q_doc = s.k_doc = ids.data();
    check_against_reference(s);
  }
  SECTION("non-causal, documents only") {
    const auto ids = doc_ids({100, 3, 297});
    AttnShape s = shape(400, 400, 2, 2, 16, false);
    s.q_doc = s.k_doc = ids.data();
    check_against_reference(s);
  }
}

TEST_CASE("document masks between offset runs (a ring step): rows without keys", "[documents]") {
  // Queries at positions [512, 812) in documents 3..5; keys at [0, 400) in
  // documents 0..3: only document 3 meets, every other query row sees no key.
  std::vector<int32_t> kd(400, 0), qd(300, 5);
  for (int64_t j = 0; j < 400; ++j) kd[size_t(j)] = j < 100 ? 0 : j < 150 ? 1 : j < 260 ? 2 : 3;
  for (int64_t i = 0; i < 300; ++i) qd[size_t(i)] = i < 70 ? 3 : i < 71 ? 4 : 5;
  AttnShape s = shape(300, 400, 2, 2, 16, true, 512, 0);
  s.q_doc = qd.data();
  s.k_doc = kd.data();
  check_against_reference(s, true);
}

TEST_CASE("sliding window matches the naive reference", "[window]") {
  for (int64_t w : {1, 7, 128, 200, 256, 300, 1000}) {
    CAPTURE(w);
    AttnShape s = shape(600, 600, 2, 1, 16, true);
    s.window = w;
    // (w = 1: every row sees only itself, its gradients are 0 up to rounding
    // and have no relative error to speak of)
    if (w > 1) check_against_reference(s);
    // Queries after the keys (a ring step): keys more than w back from the
    // first query are never computed.
    AttnShape r = shape(300, 700, 2, 1, 16, true, 700, 0);
    r.window = w;
    check_against_reference(r, w < 700);
  }
  SECTION("window with documents, offset runs") {
    const auto ids = doc_ids(random_lengths(900, "window docs"));
    std::vector<int32_t> qd(ids.begin() + 500, ids.end()), kd(ids.begin(), ids.begin() + 500);
    AttnShape s = shape(400, 500, 2, 2, 16, true, 500, 0);
    s.q_doc = qd.data();
    s.k_doc = kd.data();
    s.window = 150;
    check_against_reference(s);
  }
}

TEST_CASE("a packed sequence equals each document alone", "[documents]") {
  using trident::kernels::kKeyBlock;
  using trident::kernels::kQueryBlock;
  const std::vector<int64_t> lengths{1, kQueryBlock - 1, kKeyBlock, 37, 1, 300, 2 * kQueryBlock};
  const auto ids = doc_ids(lengths);
  const int64_t T = int64_t(ids.size());
  const int H = 4, Hkv = 2, D = 16;
  const int64_t nq = T * H * D, nk = T * Hkv * D;
  auto q = random_vec(nq, "pq"), k = random_vec(nk, "pk"), v = random_vec(nk, "pv");
  auto dout = random_vec(nq, "pdout");
  const auto& ctx = trident::test::kernel_ctx();
  AttnShape s = shape(T, T, H, Hkv, D, true);
  s.q_doc = s.k_doc = ids.data();
  std::vector<float> out(static_cast<size_t>(nq)), lse(static_cast<size_t>(T * H)),
      dq(static_cast<size_t>(nq)), dk(static_cast<size_t>(nk)), dv(static_cast<size_t>(nk));
  trident::kernels::attention_forward(ctx, s, q.data(), k.data(), v.data(), out.data(), lse.data());
  trident::kernels::attention_backward(ctx, s, q.data(), k.data(), v.data(), out.data(), lse.data(),
                                       dout.data(), dq.data(), dk.data(), dv.data());
  int64_t t0 = 0;
  for (int64_t len : lengths) {
    CAPTURE(t0, len);
    const AttnShape a = shape(len, len, H, Hkv, D, true);
    auto cut = [&](const std::vector<float>& x, int64_t width) {
      return std::vector<float>(x.begin() + t0 * width, x.begin() + (t0 + len) * width);
    };
    const auto qa = cut(q, H * D), ka = cut(k, Hkv * D), va = cut(v, Hkv * D),
               da = cut(dout, H * D);
    std::vector<float> oa(static_cast<size_t>(len * H * D)), la(static_cast<size_t>(len * H)),
        dqa(oa.size()), dka(static_cast<size_t>(len * Hkv * D)), dva(dka.size());
    trident::kernels::attention_forward(ctx, a, qa.data(), ka.data(), va.data(), oa.data(),
                                        la.data());
    trident::kernels::attention_backward(ctx, a, qa.data(), ka.data(), va.data(), oa.data(),
                                         la.data(), da.data(), dqa.data(), dka.data(), dva.data());
    auto rel = [](const std::vector<float>& got, const std::vector<float>& want) {
      double num = 0, den = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        num += double(got[i] - want[i]) * (got[i] - want[i]);
        den += double(want[i]) * want[i];
      }
      return std::sqrt(num / std::max(den, 1e-30));
    };
    CHECK(rel(cut(out, H * D), oa) <= 1e-5);
    CHECK(rel(cut(lse, H), la) <= 1e-5);
    CHECK(rel(cut(dq, H * D), dqa) <= 1e-5);
    CHECK(rel(cut(dk, Hkv * D), dka) <= 1e-5);
    CHECK(rel(cut(dv, Hkv * D), dva) <= 1e-5);
    t0 += len;
  }
}

TEST_CASE("visible pairs follow documents and window", "[documents]") {
  const auto ids = doc_ids({3, 1, 6});  // pairs 6 + 1 + 21
  AttnShape s = shape(10, 10, 2, 2, 8, true);
  s.q_doc = s.k_doc = ids.data();
  CHECK(trident::kernels::attention_visible_pairs(s) == 2 * 28);
  s.window = 2;  // each token sees itself and, inside its document, the one before: 2+0+5
  CHECK(trident::kernels::attention_visible_pairs(s) == 2 * (10 + 7));
  s.q_doc = s.k_doc = nullptr;  // window alone: 1 + 9 * 2
  CHECK(trident::kernels::attention_visible_pairs(s) == 2 * 19);
  s.q_doc = ids.data();  // one without the other
  CHECK_THROWS(trident::kernels::check_attn_shape(s));
  s.q_doc = nullptr;
  s.window = -1;
  CHECK_THROWS(trident::kernels::check_attn_shape(s));
}
