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
// The job comes from the config (bench::open_job): the rings run on
// runtime.comm's backend with their buffers on the rank's device.
//
// Every rank spot-checks two of its output rows of each ring against the
// fp64 definition (with the documents' mask for the packed ring); rows off
// by more than 1e-4 count in #wrong and make the exit code 1.
#include "trident/bench/ring_docs.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "trident/bench/engine.hpp"
#include "trident/core/error.hpp"
#include "trident/core/profiler.hpp"
#include "trident/core/rng.hpp"
#include "trident/io/bench_report.hpp"
#include "trident/kernels/tensor_ops.hpp"
#include "trident/kernels/types/attention.hpp"
#include "trident/parallel/cp/document_layout.hpp"
#include "trident/parallel/cp/ring_attention.hpp"

namespace trident::bench {
namespace {

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
  double layout_s = 0;  // computing the docs layout of the sequence (balance_documents)
  cp::RingWork work;    // this rank's modelled tile work (cp/document_layout.hpp), per head
};

// The ring's inputs and outputs at this rank's positions, on ctx's device,
// and the documents of those positions (on the device and the host).
struct RingData : AttentionTensors {
  RingData(const kernels::Ctx& ctx, const std::vector<int64_t>& pos, const RingDocsOptions& o,
           const std::vector<int32_t>& docs)
      : AttentionTensors(ctx, pos, o.heads, o.kv_heads, o.head_dim) {
    const int64_t T = int64_t(pos.size());
    for (int64_t p : pos)
      if (!docs.empty()) local_docs.push_back(docs[size_t(p)]);
    if (!docs.empty()) device_docs = kernels::from_host(ctx, local_docs.data(), {T}, DType::i32);
  }
  // The documents for the ring's calls (none without documents); own: the
  // sequence's own layout, or empty for the ring's.
  cp::LocalDocs local(const cp::SeqLayout& own) const {
    if (local_docs.empty()) return {};
    return {device_docs.data<int32_t>(), local_docs.data(), own.empty() ? nullptr : &own};
  }
  Tensor device_docs;
  std::vector<int32_t> local_docs;
};

// One ring's iterations on this rank: medians of FLOPs and compute time.
// Layout docs with documents: the sequence's own layout (balance_documents).
Measured run_case(Communicator& ring_comm, const kernels::Ctx& ctx, cp::Layout layout, int64_t seq,
                  const std::vector<int32_t>& docs, const RingDocsOptions& o) {
  cp::RingAttention ring(&ring_comm, layout, true, seq, ctx);
  ring.set_window(o.window);
  prof::Recorder work;
  ring.set_profiler(&work);
  cp::SeqLayout own;
  double layout_s = 0;
  if (layout == cp::Layout::docs && !docs.empty()) {
    const double t0 = thread_cpu_s();
    own = cp::balance_documents(docs.data(), seq, ring_comm.size(), o.window);
    layout_s = thread_cpu_s() - t0;
  }
  const std::vector<int64_t> pos =
      own.empty() ? ring.positions() : cp::run_positions(own[size_t(ring_comm.rank())]);
  const int H = o.heads, Hkv = o.kv_heads, D = o.head_dim;
  RingData d(ctx, pos, o, docs);
  const cp::LocalDocs ld = d.local(own);
  std::vector<double> flops, compute;
  for (int it = 0; it < o.iters; ++it) {
    work.clear();
    ring_comm.barrier();
    ring.forward(d.q, d.k, d.v, H, Hkv, D, d.out, d.lse, ld);
    ring.backward(d.q, d.k, d.v, d.out, d.lse, d.dout, H, Hkv, D, d.dq, d.dk, d.dv, ld);
    flops.push_back(work.counter("ring.flops"));
    compute.push_back(work.counter("ring.compute_cpu_s"));
  }
  Measured m{median(flops), median(compute), 0, 0, layout_s, {}};
  cp::SeqLayout all_runs = own;
  if (all_runs.empty())
    for (int r = 0; r < ring_comm.size(); ++r)
      all_runs.push_back(cp::local_runs(seq, ring_comm.size(), r, layout));
  m.work = cp::ring_work(all_runs, docs.empty() ? nullptr : docs.data(), seq,
                         o.window)[size_t(ring_comm.rank())];
  // Spot check: the first and last local row of head 0.
  kernels::AttnShape s{1, seq, H, Hkv, D, 1.0f / std::sqrt(float(D)), true, 0, 0};
  s.window = o.window;
  if (!docs.empty()) s.k_doc = docs.data();
  SpotCheck check;
  check_sharded_rows(check, ctx, s, pos, {0, int64_t(pos.size()) - 1}, d.out, "ring.q", "ring.k",
                     "ring.v");
  m.err = check.worst, m.wrong = double(check.wrong);
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

namespace {

// One case measured on every rank: st[r * kStats + i].
constexpr int kStats = 10;
struct CaseStats {
  std::vector<double> st;
  int cp = 1;
  double at(int r, int i) const { return st[size_t(r * kStats + i)]; }
  double max(int i) const {
    double m = 0;
    for (int r = 0; r < cp; ++r) m = std::max(m, at(r, i));
    return m;
  }
  double mean(int i) const {
    double s = 0;
    for (int r = 0; r < cp; ++r) s += at(r, i);
    return s / cp;
  }
};

// Collective over world (MPI's, the same ranks in the same order as the ring).
CaseStats gather(Communicator& world, const Measured& m) {
  const double mine[kStats] = {m.flops,        m.compute_s,     m.err,         m.wrong,
                               m.work.visible, m.work.computed, m.work.pieces, m.work.tile_rows,
                               m.work.calls,   m.layout_s};
  CaseStats c;
  c.cp = world.size();
  c.st.resize(size_t(kStats * c.cp));
  world.allgather(mine, c.st.data(), sizeof mine);
  return c;
}

std::vector<int32_t> document_ids(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> docs;
  for (size_t d = 0; d < lengths.size(); ++d)
    docs.insert(docs.end(), size_t(lengths[d]), int32_t(d));
  return docs;
}

}  // namespace

namespace {

struct DocsTables {
  BenchTable table, summary, ranks;
};

DocsTables make_tables(const RingDocsOptions& o, int cp) {
  const std::string seeds =
      o.seeds > 1 ? "seeds " + std::to_string(o.seed) + ".." + std::to_string(o.seed + o.seeds - 1)
                  : "seed " + std::to_string(o.seed);
  const std::string shape = "cp=" + std::to_string(cp) + ", heads " + std::to_string(o.heads) +
                            "/" + std::to_string(o.kv_heads) + ", head_dim " +
                            std::to_string(o.head_dim) +
                            (o.window ? ", window " + std::to_string(o.window) : "");
  TableSpec spec{
      "ring_docs",
      "Ring attention, packed documents (" + o.dist + ", " + seeds +
          ") against full causal at the same tokens: " + shape + ", forward+backward, median of " +
          std::to_string(o.iters) + " iteration(s)",
      {"layout", "seq", "mask", "seed", "docs", "mean_doc", "GFLOP_mean", "GFLOP_max",
       "flops_imbalance", "compute_ms_mean", "compute_ms_max", "compute_imbalance", "speedup_time",
       "speedup_flops", "layout_ms", "max_err", "#wrong"},
      {"GFLOP: attention FLOPs of a rank (visible pairs only: forward 4*D, backward 10*D per "
       "pair and head); compute: the rank's thread CPU time in the ring's compute spans (not "
       "inflated by waiting for a core); *_imbalance: the most loaded rank over the mean rank",
       "speedup_time: the slowest rank's compute in the causal ring over the packed ring's "
       "(what a step waits for); speedup_flops: the same for the most loaded rank's FLOPs",
       "layout_ms: the thread's CPU time computing the sequence's docs layout on a rank (the "
       "slowest; training does it once per packed sample on every rank)"}};
  TableSpec sum_spec{
      "ring_docs_seeds",
      "Over " + seeds + " (" + o.dist + "), " + shape +
          ": per layout, the packed ring's "
          "speedup over the causal ring and its imbalances",
      {"layout", "seq", "seeds", "speedup_median", "speedup_min", "speedup_max", "seeds_3x",
       "flops_reduction_median", "flops_imb_median", "flops_imb_max", "compute_imb_median",
       "compute_imb_max"},
      {"speedup: speedup_time of the table above (slowest rank, causal over packed); seeds_3x: "
       "seeds whose speedup is at least 3; flops_reduction: the mean rank's causal FLOPs over "
       "its packed FLOPs (what packing removes, whatever the layout)"}};
  TableSpec rank_spec{
      "ring_docs_ranks",
      "Per rank: the modelled tile work of one head (cp/document_layout.hpp, RingWork) and the "
      "measured compute, " +
          shape,
      {"layout", "seq", "mask", "seed", "rank", "visible", "computed", "pieces", "tile_rows",
       "calls", "model_cost", "compute_ms"},
      {"visible/computed: pairs visible / computed by the GEMM pieces; model_cost: "
       "RingWork::cost() in computed pairs; compute_ms: as above, all heads"}};
  return {spec.make(), sum_spec.make(), rank_spec.make()};
}

// Every rank's modelled work and compute of one case into the ranks table.
void add_rank_rows(BenchTable& ranks, const char* layout, int64_t seq, bool packed, uint64_t seed,
                   const CaseStats& c) {
  for (int r = 0; r < c.cp; ++r) {
    cp::RingWork w;
    w.visible = c.at(r, 4), w.computed = c.at(r, 5), w.pieces = c.at(r, 6);
    w.tile_rows = c.at(r, 7), w.calls = c.at(r, 8);
    ranks.add_row({std::string(layout), static_cast<long long>(seq),
                   std::string(packed ? "packed" : "causal"), static_cast<long long>(seed),
                   static_cast<long long>(r), w.visible, w.computed, w.pieces, w.tile_rows, w.calls,
                   w.cost(), c.at(r, 1) * 1e3});
  }
}

// One layout at one length: the causal ring once, the packed ring for every
// seed, and the layout's summary row. Returns the wrong spot-checked rows.
long long run_layout(BenchJob& job, const RingDocsOptions& o, int64_t seq, CpLayout layout,
                     DocsTables& t) {
  Communicator &ring_comm = *job.all, &world = job.world();
  const int cp = ring_comm.size(), rank = ring_comm.rank();
  long long wrong = 0;
  cp::check_layout(seq, cp, layout);
  const char* name = cp::layout_name(layout);
  const CaseStats causal = gather(world, run_case(ring_comm, job.ctx(), layout, seq, {}, o));
  wrong += static_cast<long long>(causal.mean(3) * cp);
  t.table.add_row({std::string(name), static_cast<long long>(seq), std::string("causal"), 0LL, 1LL,
                   double(seq), causal.mean(0) / 1e9, causal.max(0) / 1e9,
                   causal.max(0) / causal.mean(0), causal.mean(1) * 1e3, causal.max(1) * 1e3,
                   causal.max(1) / causal.mean(1), NAN, NAN, 0.0, causal.max(2),
                   static_cast<long long>(causal.mean(3) * cp)});
  if (o.per_rank) add_rank_rows(t.ranks, name, seq, false, 0, causal);
  std::vector<double> speedup, reduction, fimb, cimb;
  for (int i = 0; i < o.seeds; ++i) {
    const uint64_t seed = o.seed + uint64_t(i);
    const std::vector<int64_t> lengths = document_lengths(o.dist, seq, seed);
    const CaseStats c =
        gather(world, run_case(ring_comm, job.ctx(), layout, seq, document_ids(lengths), o));
    const long long nwrong = static_cast<long long>(c.mean(3) * cp);
    wrong += nwrong;
    const double ndocs = double(lengths.size());
    speedup.push_back(causal.max(1) / c.max(1));
    reduction.push_back(causal.mean(0) / c.mean(0));
    fimb.push_back(c.max(0) / c.mean(0));
    cimb.push_back(c.max(1) / c.mean(1));
    t.table.add_row({std::string(name), static_cast<long long>(seq), std::string("packed"),
                     static_cast<long long>(seed), static_cast<long long>(lengths.size()),
                     double(seq) / ndocs, c.mean(0) / 1e9, c.max(0) / 1e9, fimb.back(),
                     c.mean(1) * 1e3, c.max(1) * 1e3, cimb.back(), speedup.back(),
                     causal.max(0) / c.max(0), c.max(9) * 1e3, c.max(2), nwrong});
    if (o.per_rank) add_rank_rows(t.ranks, name, seq, true, seed, c);
    if (rank == 0)
      std::fprintf(stderr, "  done: %s seq %lld seed %llu\n", name, static_cast<long long>(seq),
                   static_cast<unsigned long long>(seed));
  }
  long long three = 0;
  for (double x : speedup) three += x >= 3.0 ? 1 : 0;
  t.summary.add_row({std::string(name), static_cast<long long>(seq),
                     static_cast<long long>(o.seeds), median(speedup),
                     *std::min_element(speedup.begin(), speedup.end()),
                     *std::max_element(speedup.begin(), speedup.end()), three, median(reduction),
                     median(fimb), *std::max_element(fimb.begin(), fimb.end()), median(cimb),
                     *std::max_element(cimb.begin(), cimb.end())});
  return wrong;
}

}  // namespace

int run_ring_docs(const Config& cfg, const RingDocsOptions& o) {
  BenchJob job = open_job(cfg);
  const int cp = job.world().size(), rank = job.world().rank();
  DocsTables t = make_tables(o, cp);
  Verdict verdict("wrong rows in total");
  for (int64_t T : o.seq_per_rank)
    for (CpLayout layout : o.layouts) verdict.add(run_layout(job, o, T * cp, layout, t));
  std::vector<BenchTable> out = {t.table};
  if (o.seeds > 1) out.push_back(t.summary);
  if (o.per_rank) out.push_back(t.ranks);
  if (rank == 0)
    for (const BenchTable& table : out) std::fputs(table.format().c_str(), stdout);
  verdict.print(rank);
  write_report(o.output, out, rank, o.command_line);
  job.world().barrier();
  verdict.print_error(rank, "bench ring --docs", "output rows differ from the fp64 reference");
  return verdict.exit_code();
}

}  // namespace trident::bench
