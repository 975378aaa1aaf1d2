// The planner's packed attention (plan/packed_attention.hpp) against the
// kernel's counted pairs: sequences drawn by the real data source from a
// token file of long-tailed documents, every sequence's visible pairs
// counted by attention_visible_pairs (what ring.flops reports), in all and
// on the busiest rank of each cp layout, against what the planner predicts
// from the data's length histogram alone.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "trident/core/rng.hpp"
#include "trident/kernels/attention.hpp"
#include "trident/model/data.hpp"
#include "trident/parallel/cp/document_layout.hpp"
#include "trident/plan/cost_model.hpp"
#include "trident/plan/packed_attention.hpp"

using namespace trident;

namespace {

// Documents with log-normal lengths (mean about `mean`, sigma 1) ending in
// token 0, `tokens` in all.
std::string write_documents(const std::string& name, double mean, int64_t tokens) {
  const std::string path =
      (std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()) + ".bin"))
          .string();
  std::vector<float> z(8192);
  rng::fill_normal(z.data(), int64_t(z.size()), rng::hash_name(name), 0, 1.0f);
  std::vector<uint16_t> ids;
  for (size_t d = 0; int64_t(ids.size()) < tokens; ++d) {
    const int64_t len =
        std::max<int64_t>(1, std::llround(std::exp(std::log(mean) - 0.5 + z[d % z.size()])));
    for (int64_t i = 0; i + 1 < len; ++i) ids.push_back(uint16_t(1 + (i + d) % 30));
    ids.push_back(0);
  }
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()), std::streamsize(ids.size() * 2));
  return path;
}

// Visible pairs of the queries of `runs` against the whole sequence.
double counted(const std::vector<int32_t>& ids, const std::vector<cp::TokenRun>& runs,
               int64_t window) {
  double pairs = 0;
  for (const cp::TokenRun& r : runs) {
    kernels::AttnShape s;
    s.Tq = r.length;
    s.Tk = int64_t(ids.size());
    s.causal = true;
    s.q_pos0 = r.pos0;
    s.q_doc = ids.data() + r.pos0;
    s.k_doc = ids.data();
    s.window = window;
    pairs += double(kernels::attention_visible_pairs(s));
  }
  return pairs;
}

}  // namespace

TEST_CASE("packed attention: the planner's pairs match the kernel's counts", "[plan][packed]") {
  const int64_t S = 2048;
  const std::string file = write_documents("trident-plan-packed", double(S) / 8, 400 * S);
  Config cfg;
  cfg.model.vocab_size = 32;
  cfg.data.task = DataTask::tokens;
  cfg.data.token_file = file;
  cfg.data.eod_token = 0;
  cfg.data.packing = Packing::documents;
  cfg.data.seq_len = int(S);
  cfg.data.micro_batch_size = 1;
  cfg.data.num_microbatches = 1;
  const auto data = model::make_data_source(cfg, 1);
  const std::vector<int64_t> bins = data->document_lengths_log2();
  for (int64_t window : {int64_t(0), int64_t(300)}) {
    const double predicted = plan::packed_pairs_per_sequence(bins, S, window);
    const int n = 300;
    double all = 0;
    const int cp = 4;
    double busiest[3] = {0, 0, 0};
    const CpLayout layouts[3] = {CpLayout::contiguous, CpLayout::zigzag, CpLayout::docs};
    for (int g = 0; g < n; ++g) {
      const model::Sample smp = data->sample(g, 0);
      all += counted(smp.doc_ids, {cp::TokenRun{0, 0, S}}, window);
      for (int l = 0; l < 3; ++l) {
        cp::SeqLayout runs;
        if (layouts[l] == CpLayout::docs)
          runs = cp::balance_documents(smp.doc_ids.data(), S, cp, window);
        else
          for (int r = 0; r < cp; ++r) runs.push_back(cp::local_runs(S, cp, r, layouts[l]));
        double top = 0;
        for (const auto& rr : runs) top = std::max(top, counted(smp.doc_ids, rr, window));
        busiest[l] += top / n;
      }
    }
    all /= n;
    std::printf("window %lld: pairs per sequence predicted %.0f, counted %.0f (%.3f)\n",
                static_cast<long long>(window), predicted, all, predicted / all);
    INFO("window " << window);
    // The histogram's bins hold lengths within a factor of 2: 10% is the
    // model's accuracy, far inside the causal triangle's 3x and more.
    CHECK(predicted == Approx(all).epsilon(0.10));
    CHECK(predicted < 0.5 * double(S) * double(S + 1) / 2);
    for (int l = 0; l < 3; ++l) {
      const double p = plan::packed_pairs_busiest_rank(bins, S, cp, layouts[l], window);
      std::printf("  %s: busiest rank predicted %.0f, counted %.0f (%.3f)\n",
                  config_name(layouts[l]).c_str(), p, busiest[l], p / busiest[l]);
      INFO(config_name(layouts[l]));
      CHECK(p == Approx(busiest[l]).epsilon(0.15));
    }
    // docs is the most even of the three, and priced so
    const double docs = plan::packed_layout_imbalance(bins, S, cp, CpLayout::docs, window);
    CHECK(docs < plan::packed_layout_imbalance(bins, S, cp, CpLayout::zigzag, window));
    CHECK(docs < plan::packed_layout_imbalance(bins, S, cp, CpLayout::contiguous, window));
    CHECK(busiest[2] < busiest[1]);
    CHECK(busiest[2] < busiest[0]);
  }
  std::remove(file.c_str());
}

TEST_CASE("packed attention: limits", "[plan][packed]") {
  // No documents: the causal triangle; with a window, its windowed pairs.
  CHECK(plan::packed_pairs_per_sequence({}, 1000, 0) == Approx(1000.0 * 1001 / 2).epsilon(1e-12));
  CHECK(plan::packed_pairs_per_sequence({}, 1000, 100) ==
        Approx(plan::window_pairs_busiest_rank(1000, 1, CpLayout::zigzag, 100)).epsilon(1e-12));
  // Documents of length 1 (bin 0): one pair per token.
  CHECK(plan::packed_pairs_per_sequence({5}, 1000, 0) == Approx(1000.0).epsilon(1e-12));
  // Documents of lengths 2 and 3 (bin 1): g(2) = 3 - 1/S and g(3) = 6 - 4/S
  // (L(L+1)/2 less the pairs a sequence boundary cuts off), over E[L] = 2.5.
  const double S = 1e6;
  CHECK(plan::packed_pairs_per_sequence({0, 7}, int64_t(S), 0) ==
        Approx(S * (9 - 5 / S) / 2 / 2.5).epsilon(1e-12));
  // One rank: no imbalance.
  CHECK(plan::packed_layout_imbalance({0, 7}, 64, 1, CpLayout::contiguous, 0) == 1.0);
}
