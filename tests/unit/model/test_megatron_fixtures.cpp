// Megatron-LM datasets as Megatron-Core writes and reads them
// (tests/fixtures/megatron, made by tests/fixtures/make_megatron_fixtures.py):
// trident reads every token Megatron's IndexedDataset reads, uint16 and int32
// ids past 32767; cuts data.split at the documents Megatron's dataset
// builder does; and interleaves a blend as Megatron's build_blending_indices.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "trident/core/error.hpp"
#include "trident/model/data.hpp"
#include "trident/model/token_files.hpp"

using namespace trident;
using namespace trident::model;

namespace {

std::string fixtures() {
  const char* src = std::getenv("TRIDENT_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/fixtures/megatron/";
}

// The lines of reference.txt whose first word is `kind`, split into words.
std::vector<std::vector<std::string>> reference(const std::string& kind) {
  std::ifstream in(fixtures() + "reference.txt");
  REQUIRE(in.good());
  std::vector<std::vector<std::string>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string x; words >> x;) w.push_back(x);
    if (!w.empty() && w[0] == kind) out.push_back(w);
  }
  return out;
}

Config megatron_config(const std::string& prefix, int vocab, const std::string& split) {
  Config c;
  c.model.vocab_size = vocab;
  c.data.task = DataTask::tokens;
  c.data.format = DataFormat::megatron;
  c.data.prefix = prefix;
  c.data.split = split;
  c.data.seq_len = 8;
  c.data.micro_batch_size = 1;
  c.data.num_microbatches = 1;
  return c;
}

int64_t documents_in(const DataSource& d) {
  const std::vector<int64_t> bins = d.document_lengths_log2();
  return std::accumulate(bins.begin(), bins.end(), int64_t(0));
}

}  // namespace

TEST_CASE("megatron fixtures: every token as Megatron reads it", "[data][megatron][fixture]") {
  const auto datasets = reference("dataset");
  REQUIRE(datasets.size() == 2);
  for (const auto& w : datasets) {
    const std::string prefix = fixtures() + w[1];
    const int vocab = std::stoi(w[2]);
    INFO(w[1] << " (" << w[3] << ")");
    auto corpus = TokenCorpus::open_megatron(prefix, vocab, "data.prefix");
    REQUIRE(corpus->n_documents() == std::stoll(w[4]));
    REQUIRE(corpus->n_tokens() == std::stoll(w[5]));
    std::ifstream in(prefix + ".read.i32", std::ios::binary);
    std::vector<int32_t> want(size_t(corpus->n_tokens()));
    in.read(reinterpret_cast<char*>(want.data()), std::streamsize(want.size() * 4));
    REQUIRE(in.good());
    int32_t largest = 0;
    for (int64_t i = 0; i < corpus->n_tokens(); ++i) {
      REQUIRE(corpus->token(i) == want[size_t(i)]);
      largest = std::max(largest, want[size_t(i)]);
    }
    REQUIRE(largest == vocab - 1);  // the ids reach the top of the vocabulary
    // one id short of the vocabulary is refused, naming the key
    REQUIRE_THROWS_WITH(TokenCorpus::open_megatron(prefix, vocab - 1, "data.prefix"),
                        Catch::Contains("data.prefix") && Catch::Contains("token id"));
  }
}

TEST_CASE("megatron fixtures: data.split cuts where Megatron's builder does",
          "[data][split][fixture]") {
  const auto splits = reference("split");
  REQUIRE(splits.size() >= 10);
  for (const auto& w : splits) {
    INFO(w[1] << " split " << w[2]);
    const std::string prefix = fixtures() + w[1];
    const int vocab = std::stoi(reference("dataset")[w[1][0] == 'g' ? 0 : 1][2]);
    const Config c = megatron_config(prefix, vocab, w[2]);
    const int64_t train0 = std::stoll(w[3]), train1 = std::stoll(w[4]);
    const int64_t valid0 = std::stoll(w[5]), valid1 = std::stoll(w[6]);
    REQUIRE(train0 == 0);
    REQUIRE(documents_in(*make_data_source(c, 1, DataPart::train)) == train1);
    if (valid1 == valid0) {  // Megatron has no validation documents: trident refuses
      REQUIRE_THROWS_AS(make_data_source(c, 1, DataPart::validation), InputError);
      continue;
    }
    auto valid = make_data_source(c, 1, DataPart::validation);
    REQUIRE(documents_in(*valid) == valid1 - valid0);
    // the first validation window starts at Megatron's first validation document
    auto corpus = TokenCorpus::open_megatron(prefix, vocab, "data.prefix");
    REQUIRE(valid->sample(0, 0).tokens[0] == corpus->token(corpus->doc_begin(valid0)));
  }
}

TEST_CASE("megatron fixtures: a blend interleaves as Megatron's", "[data][blend][fixture]") {
  const auto blends = reference("blend");
  REQUIRE(blends.size() >= 3);
  for (const auto& w : blends) {
    INFO("weights " << w[1]);
    std::vector<double> weights;
    std::stringstream ws(w[1]);
    for (std::string x; std::getline(ws, x, ',');) weights.push_back(std::stod(x));
    const size_t n = size_t(std::stoi(w[2]));
    const std::vector<int> order = make_blend_order(weights, 1000);
    std::vector<int> want, got(order.begin(), order.begin() + long(n));
    for (size_t i = 0; i < n; ++i) want.push_back(std::stoi(w[3 + i]));
    REQUIRE(got == want);
  }
}
