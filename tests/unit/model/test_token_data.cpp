// Token data as users have it: Megatron indexed datasets written here in
// their layout, flat files with an end-of-document token, blends, the
// train/validation split, document packing, and the files that are refused.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <set>

#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/model/data.hpp"
#include "trident/model/token_files.hpp"

using namespace trident;
using namespace trident::model;

namespace {

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Writes PREFIX.bin and PREFIX.idx as Megatron-LM's indexed dataset does:
// every document one sequence, ids as uint16 (dtype code 8) or int32 (4).
void write_megatron(const std::string& prefix, const std::vector<std::vector<int>>& docs,
                    uint8_t code = 8) {
  std::string bin, idx;
  const int width = code == 8 ? 2 : 4;
  for (const auto& d : docs)
    for (int t : d) {
      if (width == 2)
        put(bin, uint16_t(t));
      else
        put(bin, int32_t(t));
    }
  idx.append("MMIDIDX\0\0", 9);
  put(idx, uint64_t(1));
  put(idx, code);
  put(idx, uint64_t(docs.size()));
  put(idx, uint64_t(docs.size() + 1));
  for (const auto& d : docs) put(idx, int32_t(d.size()));
  int64_t ptr = 0;
  for (const auto& d : docs) {
    put(idx, ptr);
    ptr += int64_t(d.size()) * width;
  }
  for (size_t k = 0; k <= docs.size(); ++k) put(idx, int64_t(k));
  std::ofstream(prefix + ".bin", std::ios::binary) << bin;
  std::ofstream(prefix + ".idx", std::ios::binary) << idx;
}

void write_flat(const std::string& path, const std::vector<int>& ids) {
  std::string out;
  for (int t : ids) put(out, uint16_t(t));
  std::ofstream(path, std::ios::binary) << out;
}

// Documents whose ids say where they come from: document k of dataset `tag`
// holds tag*20 + k % 20 everywhere, lengths given.
std::vector<std::vector<int>> docs_of(int tag, const std::vector<int>& lengths) {
  std::vector<std::vector<int>> docs;
  for (size_t k = 0; k < lengths.size(); ++k)
    docs.push_back(std::vector<int>(size_t(lengths[k]), tag * 20 + int(k % 20)));
  return docs;
}

Config token_config(int seq_len) {
  Config c;
  c.data.task = DataTask::tokens;
  c.data.seq_len = seq_len;
  c.data.micro_batch_size = 2;
  c.data.num_microbatches = 2;
  c.model.vocab_size = 100;
  return c;
}

std::string error_of(const Config& c, DataPart part = DataPart::train) {
  try {
    make_data_source(c, 1, part);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The sample as a reference computes it from the whole stream: tokens
// [start, start + L], document starts at `begins`.
void check_packed(const Sample& s, const std::vector<int>& stream, const std::set<int64_t>& begins,
                  int64_t start, int L) {
  int id = 0, first = 0;
  for (int p = 0; p < L; ++p) {
    if (p > 0 && begins.count(start + p)) {
      ++id;
      first = p;
    }
    INFO("position " << p << " of the window at " << start);
    REQUIRE(s.tokens[size_t(p)] == stream[size_t(start + p)]);
    REQUIRE(s.doc_ids[size_t(p)] == id);
    REQUIRE(s.positions[size_t(p)] == p - first);
    REQUIRE(s.targets[size_t(p)] ==
            (begins.count(start + p + 1) ? -1 : stream[size_t(start + p + 1)]));
  }
}

}  // namespace

TEST_CASE("megatron reader: documents and tokens as written", "[data][megatron]") {
  const std::vector<int> lengths = {5, 1, 17, 3, 40, 2, 9};
  write_megatron("tt_mega", docs_of(1, lengths));
  auto c = TokenCorpus::open_megatron("tt_mega", 100, "data.prefix");
  REQUIRE(c->n_documents() == int64_t(lengths.size()));
  REQUIRE(c->n_tokens() == std::accumulate(lengths.begin(), lengths.end(), int64_t(0)));
  int64_t at = 0;
  for (size_t k = 0; k < lengths.size(); ++k) {
    REQUIRE(c->doc_begin(int64_t(k)) == at);
    for (int i = 0; i < lengths[k]; ++i) {
      REQUIRE(c->token(at + i) == 20 + int(k));
      REQUIRE(c->document_of(at + i) == int64_t(k));
    }
    at += lengths[k];
  }
  // int32 ids (dtype code 4) read alike
  write_megatron("tt_mega32", docs_of(2, lengths), 4);
  auto c32 = TokenCorpus::open_megatron("tt_mega32", 100, "data.prefix");
  REQUIRE(c32->token(5) == 41);
  REQUIRE(c32->n_documents() == 7);
}

TEST_CASE("packing: doc_ids, positions and targets at every boundary", "[data][packing]") {
  // a document of length 1, one longer than seq_len (split), boundaries on
  // the window's last token and right after it
  const int L = 16;
  const std::vector<int> lengths = {1, 15, 40, 3, 16, 1, 1, 12, 7, 33, 2, 5, 16, 16, 1, 9};
  std::vector<std::vector<int>> docs;
  std::vector<int> stream;
  std::set<int64_t> begins;
  uint64_t ctr = 0;
  for (int len : lengths) {
    begins.insert(int64_t(stream.size()));
    std::vector<int> d;
    for (int i = 0; i < len; ++i) d.push_back(int(rng::below(77, ctr++, 100)));
    stream.insert(stream.end(), d.begin(), d.end());
    docs.push_back(d);
  }
  write_megatron("tt_pack", docs);
  Config c = token_config(L);
  c.data.format = DataFormat::megatron;
  c.data.prefix = "tt_pack";
  c.data.packing = Packing::documents;
  auto d = make_data_source(c, 1);
  const int64_t gb = 4, span = int64_t(stream.size()) - L;
  std::set<int> pieces_seen;
  for (int64_t step = 0; step < 6; ++step) {
    int64_t targets = 0;
    for (int64_t g = 0; g < gb; ++g) {
      const Sample s = d->sample(step, g);
      const int64_t start = ((step * gb + g) * L) % span;
      check_packed(s, stream, begins, start, L);
      for (int t : s.targets) targets += t >= 0;
      pieces_seen.insert(s.doc_ids.back());
    }
    REQUIRE(d->targets_in_batch(step, gb) == targets);
  }
  REQUIRE(*pieces_seen.rbegin() >= 3);  // windows holding several documents were seen
  // window 0: a document of length 1, then one ending on the window's last
  // token; windows 1 and 2: pieces of the 40-token document, each from 0
  const Sample w0 = d->sample(0, 0), w1 = d->sample(0, 1);
  REQUIRE(w0.targets[0] == -1);
  REQUIRE(w0.targets[15] == -1);
  REQUIRE(w0.doc_ids[15] == 1);
  REQUIRE(w1.doc_ids == std::vector<int32_t>(16, 0));
  REQUIRE(w1.positions[0] == 0);
  REQUIRE(w1.targets[15] == stream[32]);
  // reset_positions = false: no per-document positions (0..L-1 as one)
  c.data.reset_positions = false;
  REQUIRE(make_data_source(c, 1)->sample(0, 1).positions.empty());
  // packing = "none": the same tokens, no documents, every target kept
  c.data.packing = Packing::none;
  const Sample plain = make_data_source(c, 1)->sample(0, 1);
  REQUIRE(plain.doc_ids.empty());
  REQUIRE(plain.tokens == d->sample(0, 1).tokens);
  for (int t : plain.targets) REQUIRE(t >= 0);
}

TEST_CASE("flat file with an end-of-document token", "[data][eod]") {
  // documents end with (and include) the eod token 99
  const std::vector<int> ids = {5, 6, 99, 7, 99, 8, 8, 8, 8, 99, 1, 2, 3, 4, 5, 6, 7, 99, 3, 3};
  write_flat("tt_eod.bin", ids);
  auto corpus = TokenCorpus::open_flat("tt_eod.bin", TokenDType::uint16, 99, 100, "k");
  REQUIRE(corpus->n_documents() == 5);
  REQUIRE(corpus->doc_begin(1) == 3);
  REQUIRE(corpus->doc_begin(2) == 5);
  REQUIRE(corpus->doc_begin(3) == 10);
  REQUIRE(corpus->doc_begin(4) == 18);
  REQUIRE(corpus->doc_begin(5) == 20);
  Config c = token_config(8);
  c.data.token_file = "tt_eod.bin";
  c.data.eod_token = 99;
  c.data.packing = Packing::documents;
  auto d = make_data_source(c, 1);
  std::set<int64_t> begins = {0, 3, 5, 10, 18};
  for (int64_t g = 0; g < 4; ++g) check_packed(d->sample(0, g), ids, begins, (g * 8) % 12, 8);
  // eod_token unset: one document, no boundaries
  c.data.eod_token = -1;
  const Sample one = make_data_source(c, 1)->sample(0, 0);
  for (int id : one.doc_ids) REQUIRE(id == 0);
}

TEST_CASE("blend: deterministic, weighted, each dataset read in order", "[data][blend]") {
  write_megatron("tt_blend_a", docs_of(1, std::vector<int>(50, 8)));
  write_megatron("tt_blend_b", docs_of(3, std::vector<int>(50, 8)));
  Config c = token_config(8);
  c.data.format = DataFormat::megatron;
  c.data.blend = {{0.7, "tt_blend_a"}, {0.3, "tt_blend_b"}};
  auto d = make_data_source(c, 1);
  auto again = make_data_source(c, 1);
  int from_a = 0, from_b = 0;
  for (int64_t step = 0; step < 250; ++step)
    for (int64_t g = 0; g < 4; ++g) {
      const Sample s = d->sample(step, g);
      REQUIRE(s.tokens == again->sample(step, g).tokens);
      (s.tokens[0] < 40 ? from_a : from_b)++;
    }
  REQUIRE(from_a == 700);  // 1000 samples: the shares are exact per block of 1000
  REQUIRE(from_b == 300);
  // every block gives each dataset its share, and within one the greedy
  // order never runs ahead or behind by a whole sample
  const auto order = make_blend_order({2.0, 1.0, 1.0}, 1000);
  std::vector<int> count(3, 0);
  for (size_t j = 0; j < order.size(); ++j) {
    ++count[size_t(order[j])];
    REQUIRE(std::abs(count[0] - 0.5 * double(j + 1)) <= 1.0);
    REQUIRE(std::abs(count[1] - 0.25 * double(j + 1)) <= 1.0);
  }
  REQUIRE(count == std::vector<int>{500, 250, 250});
  // consecutive samples of one dataset read its consecutive windows
  c.data.blend = {{0.5, "tt_blend_a"}, {0.5, "tt_blend_b"}};
  auto half = make_data_source(c, 1);
  REQUIRE(half->sample(0, 0).tokens[0] == 20);  // a's window 0: document 0
  REQUIRE(half->sample(0, 1).tokens[0] == 60);  // b's window 0
  REQUIRE(half->sample(0, 2).tokens[0] == 21);  // a's window 1: document 1
}

TEST_CASE("split: training and validation documents are disjoint", "[data][split]") {
  // 100 documents of 8 tokens, each holding its own number
  std::vector<std::vector<int>> docs;
  for (int k = 0; k < 100; ++k) docs.push_back(std::vector<int>(8, k));
  write_megatron("tt_split", docs);
  Config c = token_config(8);
  c.data.format = DataFormat::megatron;
  c.data.prefix = "tt_split";
  c.data.split = "90,10";
  auto train = make_data_source(c, 1, DataPart::train);
  auto valid = make_data_source(c, 1, DataPart::validation);
  std::set<int> seen_train, seen_valid;
  for (int64_t step = 0; step < 40; ++step)
    for (int64_t g = 0; g < 4; ++g) {
      for (int t : train->sample(step, g).tokens) seen_train.insert(t);
      for (int t : valid->sample(step, g).tokens) seen_valid.insert(t);
    }
  // windows start before the part's last seq_len tokens, so the last
  // document is seen as targets only
  REQUIRE(seen_train.size() == 89);
  REQUIRE(*seen_train.rbegin() == 88);
  REQUIRE(seen_valid.size() == 9);
  REQUIRE(*seen_valid.begin() == 90);
  // the three-way Megatron form: test share left unread
  c.data.split = "80,10,10";
  auto v3 = make_data_source(c, 1, DataPart::validation);
  for (int t : v3->sample(3, 1).tokens) REQUIRE((t >= 80 && t < 90));
  // the validation share too small for a sample is named
  c.data.split = "99,1";
  REQUIRE(error_of(c, DataPart::validation).find("validation share") != std::string::npos);
  REQUIRE_THROWS_AS(data_split_shares("98"), InputError);
  REQUIRE_THROWS_AS(data_split_shares("0,5"), InputError);
  REQUIRE_THROWS_AS(data_split_shares("9x,1"), InputError);
}

TEST_CASE("bad token files: one line naming the file and the offset", "[data][bad]") {
  const std::vector<int> lengths = {10, 10, 10};
  Config c = token_config(8);
  c.data.format = DataFormat::megatron;
  c.data.prefix = "tt_bad";
  auto expect = [&](const std::string& file, const std::string& offset, const std::string& rule) {
    const std::string e = error_of(c);
    INFO(e);
    REQUIRE(e.find("data.prefix: '" + file + "'") == 0);
    REQUIRE(e.find("byte offset " + offset + ":") != std::string::npos);
    REQUIRE(e.find(rule) != std::string::npos);
    REQUIRE(e.find('\n') == std::string::npos);
  };
  // truncated .bin: the last sequence runs past its end
  write_megatron("tt_bad", docs_of(1, lengths));
  std::filesystem::resize_file("tt_bad.bin", 50);
  expect("tt_bad.idx", std::to_string(34 + 12 + 16), "runs past the end of 'tt_bad.bin'");
  // bad magic
  write_megatron("tt_bad", docs_of(1, lengths));
  {
    std::fstream f("tt_bad.idx", std::ios::in | std::ios::out | std::ios::binary);
    f.write("XX", 2);
  }
  expect("tt_bad.idx", "0", "bad magic");
  // a pointer past the end of the .bin (and not back to back)
  write_megatron("tt_bad", docs_of(1, lengths));
  {
    std::fstream f("tt_bad.idx", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(34 + 12 + 8);
    const int64_t far = 1 << 20;
    f.write(reinterpret_cast<const char*>(&far), 8);
  }
  expect("tt_bad.idx", std::to_string(34 + 12 + 8), "starts at byte 1048576");
  // a document index past the sequence count
  write_megatron("tt_bad", docs_of(1, lengths));
  {
    std::fstream f("tt_bad.idx", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(34 + 12 + 24 + 16);
    const int64_t far = 9;
    f.write(reinterpret_cast<const char*>(&far), 8);
  }
  expect("tt_bad.idx", std::to_string(34 + 12 + 24 + 16), "document index 2 is 9");
  // an index cut short
  write_megatron("tt_bad", docs_of(1, lengths));
  std::filesystem::resize_file("tt_bad.idx", 60);
  expect("tt_bad.idx", "60", "need 102");
  // an id >= vocab_size: byte offset in the .bin
  write_megatron("tt_bad", docs_of(1, lengths));
  c.model.vocab_size = 22;  // document 2 holds id 22
  expect("tt_bad.bin", "40", "token id 22 is not in [0, model.vocab_size = 22)");
  c.model.vocab_size = 100;
  // too short for one sequence
  c.data.seq_len = 30;
  REQUIRE(error_of(c).find("shorter than one sample (data.seq_len + 1 = 31)") != std::string::npos);
  // flat: id too large, with its offset
  write_flat("tt_bad_flat.bin", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 120});
  c = token_config(8);
  c.data.token_file = "tt_bad_flat.bin";
  const std::string e = error_of(c);
  REQUIRE(e ==
          "data.token_file: 'tt_bad_flat.bin' byte offset 22: token id 120 is not in [0, "
          "model.vocab_size = 100)");
}
