// `trident bench ring --docs DIST`: what packing documents saves under ring
// attention, and how evenly the saved work is spread over the ranks.
//
// For each local length and layout, two rings over the same tokens: full
// causal (one document) and packed (documents drawn from DIST, attention
// inside each). Per rank: attention FLOPs (ring.flops: visible pairs only)
// and compute time (the thread's CPU time in the ring's compute spans, which
// waiting for a core does not inflate, so that ranks outnumbering cores still
// measure their own work), median over iterations. Per case: the slowest
// rank's compute (what a step waits for) and its ratio causal / packed, and
// the balance max / mean of FLOPs and of compute over ranks. Zig-zag
// balances the causal triangle; under packing the work is the documents'
// triangles, wherever they fall, and the table says how far that is from
// even. Layout docs lays each packed sequence out by its documents
// (cp/document_layout.hpp); its causal row is zig-zag's (no documents).
//
// Every rank spot-checks two of its output rows of the packed ring against
// the fp64 definition with the documents' mask.
#include "bench_ring_docs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "bench_harness.hpp"
#include "commands.hpp"
#include "trident/core/error.hpp"
#include "trident/core/profiler.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/parallel/cp/document_layout.hpp"
#include "trident/parallel/cp/ring_attention.hpp"

namespace trident::cli {
namespace {

std::vector<float> rows_at(const std::vector<int64_t>& positions, int64_t row_elems,
                           const char* name) {
  std::vector<float> x(positions.size() * size_t(row_elems));
  for (size_t t = 0; t < positions.size(); ++t)
    rng::fill_normal(x.data() + t * size_t(row_elems), row_elems, rng::hash_name(name),
                     uint64_t(positions[t] * row_elems), 1.0f);
  return x;
}

[[noreturn]] void bad_dist(const std::string& dist, const std::string& rule) {
  throw InputError("--docs " + dist + ": " + rule);
}

double parse_number(const std::string& dist, const std::string& text) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && std::isfinite(v) && v > 0) return v;
  } catch (const std::exception&) {
  }
  bad_dist(dist, "'" + text + "' is not a positive number");
}

struct Measured {
  double flops = 0, compute_s = 0;
  double err = 0, wrong = 0;
};

// One ring's iterations on this rank: medians of FLOPs and compute time.
// Layout docs with documents: the sequence's own layout (balance_documents).
Measured run_case(Communicator& ring_comm, cp::Layout layout, int64_t seq,
                  const std::vector<int32_t>& docs, const RingDocsOptions& o) {
  cp::RingAttention ring(&ring_comm, layout, true, seq);
  ring.set_window(o.window);
  prof::Recorder work;
  ring.set_profiler(&work);
  cp::SeqLayout own;
  if (layout == cp::Layout::docs && !docs.empty())
    own = cp::balance_documents(docs.data(), seq, ring_comm.size(), o.window);
  const std::vector<int64_t> pos =
      own.empty() ? ring.positions() : cp::run_positions(own[size_t(ring_comm.rank())]);
  const int H = o.heads, Hkv = o.kv_heads, D = o.head_dim;
  auto q = rows_at(pos, int64_t(H) * D, "ring.q"), k = rows_at(pos, int64_t(Hkv) * D, "ring.k");
  auto v = rows_at(pos, int64_t(Hkv) * D, "ring.v"), dout = rows_at(pos, int64_t(H) * D, "ring.do");
  std::vector<float> out(q.size()), lse(pos.size() * size_t(H)), dq(q.size()), dk(k.size()),
      dv(v.size());
  std::vector<int32_t> local;
  for (int64_t p : pos)
    if (!docs.empty()) local.push_back(docs[size_t(p)]);
  const cp::LocalDocs ld =
      docs.empty() ? cp::LocalDocs{}
                   : cp::LocalDocs{local.data(), local.data(), own.empty() ? nullptr : &own};
  std::vector<double> flops, compute;
  for (int it = 0; it < o.iters; ++it) {
    work.clear();
    ring_comm.barrier();
    ring.forward(q.data(), k.data(), v.data(), H, Hkv, D, out.data(), lse.data(), ld);
    ring.backward(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), H, Hkv, D,
                  dq.data(), dk.data(), dv.data(), ld);
    flops.push_back(work.counter("ring.flops"));
    compute.push_back(work.counter("ring.compute_cpu_s"));
  }
  Measured m{median(flops), median(compute), 0, 0};
  // Spot check: the first and last local row of head 0.
  std::vector<int64_t> all(static_cast<size_t>(seq));
  for (int64_t i = 0; i < seq; ++i) all[size_t(i)] = i;
  const auto gk = rows_at(all, int64_t(Hkv) * D, "ring.k"),
             gv = rows_at(all, int64_t(Hkv) * D, "ring.v");
  std::vector<double> ref(static_cast<size_t>(D));
  const int64_t T = int64_t(pos.size());
  for (int64_t i : {int64_t(0), T - 1}) {
    kernels::AttnShape s;
    s.Tq = 1, s.Tk = seq, s.H = H, s.Hkv = Hkv, s.D = D;
    s.scale = 1.0f / std::sqrt(float(D));
    s.causal = true;
    s.window = o.window;
    s.q_pos0 = pos[size_t(i)];
    if (!docs.empty()) {
      s.q_doc = &docs[size_t(pos[size_t(i)])];
      s.k_doc = docs.data();
    }
    kernels::attention_reference_row(s, q.data() + i * H * D, gk.data(), gv.data(), 0, 0,
                                     ref.data());
    double num = 0, den = 0;
    for (int d = 0; d < D; ++d) {
      const double diff = out[size_t(i * H * D + d)] - ref[size_t(d)];
      num += diff * diff, den += ref[size_t(d)] * ref[size_t(d)];
    }
    const double err = std::sqrt(num / std::max(den, 1e-30));
    m.err = std::max(m.err, err);
    if (!(err <= 1e-4)) m.wrong += 1;
  }
  return m;
}

}  // namespace

std::vector<int64_t> document_lengths(const std::string& dist, int64_t seq, uint64_t seed) {
  std::vector<std::string> parts;
  std::stringstream ss(dist);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  if (parts.empty()) bad_dist(dist, "names no distribution");
  std::vector<int64_t> len;
  if (parts[0] == "fixed") {
    if (parts.size() != 2) bad_dist(dist, "must be fixed:LEN");
    const int64_t l = int64_t(parse_number(dist, parts[1]));
    if (l < 1) bad_dist(dist, "LEN must be >= 1");
    for (int64_t used = 0; used < seq; used += l) len.push_back(std::min(l, seq - used));
    return len;
  }
  if (parts[0] != "lognormal" || parts.size() > 3)
    bad_dist(dist, "must be lognormal[:MEAN[:SIGMA]] or fixed:LEN");
  const double mean = parts.size() > 1 ? parse_number(dist, parts[1]) : double(seq) / 8;
  const double sigma = parts.size() > 2 ? parse_number(dist, parts[2]) : 1.0;
  // exp(mu + sigma z) has mean exp(mu + sigma^2 / 2).
  const double mu = std::log(mean) - sigma * sigma / 2;
  std::vector<float> z(64);
  int64_t used = 0;
  for (uint64_t t = 0; used < seq; ++t) {
    if (t % z.size() == 0)
      rng::fill_normal(z.data(), int64_t(z.size()), rng::hash_name("bench.docs") ^ seed, t, 1.0f);
    const int64_t l = std::max<int64_t>(1, std::llround(std::exp(mu + sigma * z[t % z.size()])));
    len.push_back(std::min(l, seq - used));
    used += len.back();
  }
  return len;
}

long long run_ring_docs(Communicator& ring_comm, const RingDocsOptions& o) {
  const int cp = ring_comm.size(), rank = ring_comm.rank();
  TableSpec spec{
      "ring_docs",
      "Ring attention, packed documents (" + o.dist + ", seed " + std::to_string(o.seed) +
          ") against full causal at the same tokens: cp=" + std::to_string(cp) + ", heads " +
          std::to_string(o.heads) + "/" + std::to_string(o.kv_heads) + ", head_dim " +
          std::to_string(o.head_dim) + (o.window ? ", window " + std::to_string(o.window) : "") +
          ", forward+backward, median of " + std::to_string(o.iters) + " iteration(s)",
      {"layout", "seq", "mask", "docs", "mean_doc", "GFLOP_mean", "GFLOP_max", "flops_imbalance",
       "compute_ms_mean", "compute_ms_max", "compute_imbalance", "speedup_time", "speedup_flops",
       "max_err", "#wrong"},
      {"GFLOP: attention FLOPs of a rank (visible pairs only: forward 4*D, backward 10*D per "
       "pair and head); compute: the rank's thread CPU time in the ring's compute spans (not "
       "inflated by waiting for a core); *_imbalance: the most loaded rank over the mean rank",
       "speedup_time: the slowest rank's compute in the causal ring over the packed ring's "
       "(what a step waits for); speedup_flops: the same for the most loaded rank's FLOPs"}};
  BenchTable table = spec.make();
  long long wrong = 0;
  for (int64_t T : o.seq_per_rank) {
    const int64_t seq = T * cp;
    const std::vector<int64_t> lengths = document_lengths(o.dist, seq, o.seed);
    std::vector<int32_t> docs;
    for (size_t d = 0; d < lengths.size(); ++d)
      docs.insert(docs.end(), size_t(lengths[d]), int32_t(d));
    for (CpLayout layout : o.layouts) {
      cp::check_layout(seq, cp, layout);
      double causal_max_t = 0, causal_max_f = 0;
      for (bool packed : {false, true}) {
        const Measured m =
            run_case(ring_comm, layout, seq, packed ? docs : std::vector<int32_t>{}, o);
        const double mine[4] = {m.flops, m.compute_s, m.err, m.wrong};
        std::vector<double> all(size_t(4 * cp));
        ring_comm.allgather(mine, all.data(), sizeof mine);
        double fsum = 0, fmax = 0, csum = 0, cmax = 0, emax = 0, nwrong = 0;
        for (int r = 0; r < cp; ++r) {
          const double* st = all.data() + 4 * r;
          fsum += st[0], fmax = std::max(fmax, st[0]);
          csum += st[1], cmax = std::max(cmax, st[1]);
          emax = std::max(emax, st[2]), nwrong += st[3];
        }
        wrong += static_cast<long long>(nwrong);
        if (!packed) causal_max_t = cmax, causal_max_f = fmax;
        const long long ndocs = packed ? static_cast<long long>(lengths.size()) : 1;
        table.add_row({cp::layout_name(layout), static_cast<long long>(seq),
                       std::string(packed ? "packed" : "causal"), ndocs,
                       double(seq) / double(ndocs), fsum / cp / 1e9, fmax / 1e9, fmax / (fsum / cp),
                       csum / cp * 1e3, cmax * 1e3, cmax / (csum / cp),
                       packed ? causal_max_t / cmax : NAN, packed ? causal_max_f / fmax : NAN, emax,
                       static_cast<long long>(nwrong)});
        if (rank == 0)
          std::fprintf(stderr, "  done: %s seq %lld %s\n", cp::layout_name(layout),
                       static_cast<long long>(seq), packed ? "packed" : "causal");
      }
    }
  }
  if (rank == 0) {
    std::fputs(table.format().c_str(), stdout);
    std::printf("# wrong rows in total: %lld (%s)\n", wrong, wrong ? "FAILED" : "OK");
    std::fflush(stdout);
    if (!o.output.empty()) write_bench_file(o.output, {table}, command_line());
  }
  return wrong;
}

}  // namespace trident::cli
