// Training data: determinism, the recall task's structure, token files.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "trident/core/error.hpp"
#include "trident/model/data.hpp"

using namespace trident;
using namespace trident::model;

TEST_CASE("recall samples are keyed by (seed, step, index) and hold their answers", "[data]") {
  Config c;
  c.data.seq_len = 128;
  c.model.vocab_size = 64;
  auto d = make_data_source(c, 1);
  Sample a = d->sample(3, 5), b = d->sample(3, 5), e = d->sample(3, 6), f = d->sample(4, 5);
  REQUIRE(a.tokens == b.tokens);
  REQUIRE(a.tokens != e.tokens);
  REQUIRE(a.tokens != f.tokens);
  // every query "? key value" repeats the value stored with that key early on
  std::map<int, int> stored;
  for (int p = 1; p + 1 < 40 && a.tokens[size_t(p)] >= 4 && a.tokens[size_t(p)] < 19; p += 2)
    stored[a.tokens[size_t(p)]] = a.tokens[size_t(p + 1)];
  REQUIRE(stored.size() == 8);
  int queries = 0;
  for (size_t p = 64; p + 2 < a.tokens.size(); ++p)
    if (a.tokens[p] == 1) {
      REQUIRE(stored.at(a.tokens[p + 1]) == a.tokens[p + 2]);
      REQUIRE(a.targets[p + 1] == a.tokens[p + 2]);
      ++queries;
    }
  REQUIRE(queries == 8);
  REQUIRE(a.targets.back() == -1);
  for (int t : a.tokens) REQUIRE((t >= 0 && t < 64));
  c.model.vocab_size = 8;
  REQUIRE_THROWS_AS(make_data_source(c, 1), InputError);
}

TEST_CASE("token file: windows, dtype and a file shorter than one sample", "[data]") {
  const std::string path = "test_data_tokens.bin";
  {
    std::ofstream o(path, std::ios::binary);
    for (uint16_t i = 0; i < 100; ++i) {
      uint16_t v = i % 50;
      o.write(reinterpret_cast<const char*>(&v), 2);
    }
  }
  Config c;
  c.data.task = DataTask::tokens;
  c.data.token_file = path;
  c.data.seq_len = 16;
  c.model.vocab_size = 50;
  auto d = make_data_source(c, 1);
  Sample s = d->sample(0, 1);
  REQUIRE(s.tokens[0] == 16);
  REQUIRE(s.targets[0] == 17);
  REQUIRE(d->targets_per_sample() == 16);
  c.model.vocab_size = 40;  // ids up to 49 do not fit
  REQUIRE_THROWS_AS(make_data_source(c, 1), InputError);
  c.model.vocab_size = 50;
  c.data.seq_len = 100;  // needs 101 tokens
  try {
    make_data_source(c, 1);
    FAIL("a token file shorter than one sample was accepted");
  } catch (const InputError& e) {
    REQUIRE(std::string(e.what()).find("shorter than one sample") != std::string::npos);
  }
  std::remove(path.c_str());
}
