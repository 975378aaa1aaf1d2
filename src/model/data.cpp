// Synthetic tasks and the token-file reader (see model/data.hpp).
#include "trident/model/data.hpp"

#include <algorithm>
#include <fstream>
#include <numeric>

#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"

namespace trident::model {
namespace {

// Key of one sample's random stream: every draw is (key, counter).
uint64_t sample_key(uint64_t seed, int64_t step, int64_t g) {
  return rng::combine(rng::combine(rng::hash_name("data") ^ seed, uint64_t(step)), uint64_t(g));
}

class RecallTask : public DataSource {
 public:
  explicit RecallTask(const Config& cfg) : seed_(cfg.data.seed), L_(cfg.data.seq_len) {
    const int V = cfg.model.vocab_size;
    if (V < 16)
      throw InputError("model.vocab_size: the recall task needs >= 16 token ids (got " +
                       std::to_string(V) + ")");
    const int avail = V - kFirst;
    nk_ = avail / 4;
    nv_ = avail / 4;
    nf_ = avail - nk_ - nv_;
    pairs_ = std::min<int>(nk_, std::max<int>(1, L_ / 16));
    if (L_ < 5 * pairs_ + 2)
      throw InputError("data.seq_len: the recall task needs >= " + std::to_string(5 * pairs_ + 2) +
                       " tokens (got " + std::to_string(L_) + ")");
  }

  Sample sample(int64_t step, int64_t g) const override {
    const uint64_t key = sample_key(seed_, step, g);
    uint64_t ctr = 0;
    Sample s;
    s.tokens.assign(size_t(L_), 0);
    // distinct keys: a partial Fisher-Yates shuffle of the key range
    std::vector<int> keys(static_cast<size_t>(nk_));
    std::iota(keys.begin(), keys.end(), 0);
    for (int i = 0; i < pairs_; ++i) {
      int j = i + int(rng::below(key, ctr++, uint64_t(nk_ - i)));
      std::swap(keys[size_t(i)], keys[size_t(j)]);
    }
    std::vector<int> vals(static_cast<size_t>(pairs_));
    for (int i = 0; i < pairs_; ++i) vals[size_t(i)] = int(rng::below(key, ctr++, uint64_t(nv_)));
    s.tokens[0] = kBos;
    for (int i = 0; i < pairs_; ++i) {
      s.tokens[size_t(1 + 2 * i)] = kFirst + keys[size_t(i)];
      s.tokens[size_t(2 + 2 * i)] = kFirst + nk_ + vals[size_t(i)];
    }
    const int q_begin = L_ - 3 * pairs_;
    const int f0 = int(rng::below(key, ctr++, uint64_t(nf_)));
    for (int p = 1 + 2 * pairs_, i = 0; p < q_begin; ++p, ++i)
      s.tokens[size_t(p)] = kFirst + nk_ + nv_ + (f0 + i) % nf_;
    std::vector<int> order(static_cast<size_t>(pairs_));
    std::iota(order.begin(), order.end(), 0);
    for (int i = pairs_ - 1; i > 0; --i)
      std::swap(order[size_t(i)], order[size_t(rng::below(key, ctr++, uint64_t(i + 1)))]);
    for (int i = 0; i < pairs_; ++i) {
      const int pr = order[size_t(i)];
      s.tokens[size_t(q_begin + 3 * i)] = kQuery;
      s.tokens[size_t(q_begin + 3 * i + 1)] = kFirst + keys[size_t(pr)];
      s.tokens[size_t(q_begin + 3 * i + 2)] = kFirst + nk_ + vals[size_t(pr)];
    }
    s.targets.assign(size_t(L_), -1);
    for (int p = 0; p + 1 < L_; ++p) s.targets[size_t(p)] = s.tokens[size_t(p + 1)];
    return s;
  }
  int64_t targets_per_sample() const override { return L_ - 1; }

 private:
  static constexpr int kBos = 0, kQuery = 1, kFirst = 4;
  uint64_t seed_;
  int L_;
  int nk_ = 0, nv_ = 0, nf_ = 0, pairs_ = 0;
};

class CopyTask : public DataSource {
 public:
  explicit CopyTask(const Config& cfg)
      : seed_(cfg.data.seed), L_(cfg.data.seq_len), V_(cfg.model.vocab_size) {
    if (L_ % 2 != 0)
      throw InputError("data.seq_len: the copy task needs an even length (got " +
                       std::to_string(L_) + ")");
    if (V_ < 4) throw InputError("model.vocab_size: the copy task needs >= 4 token ids");
  }
  Sample sample(int64_t step, int64_t g) const override {
    const uint64_t key = sample_key(seed_, step, g);
    const int half = L_ / 2;
    Sample s;
    s.tokens.assign(size_t(L_), 0);
    s.tokens[0] = 0;  // BOS
    for (int i = 1; i < half; ++i) s.tokens[size_t(i)] = 1 + int(rng::below(key, uint64_t(i), uint64_t(V_ - 1)));
    s.tokens[size_t(half)] = 0;  // separator
    for (int i = 1; i < half; ++i) s.tokens[size_t(half + i)] = s.tokens[size_t(i)];
    s.targets.assign(size_t(L_), -1);
    for (int p = half; p + 1 < L_; ++p) s.targets[size_t(p)] = s.tokens[size_t(p + 1)];
    return s;
  }
  int64_t targets_per_sample() const override { return L_ / 2 - 1; }

 private:
  uint64_t seed_;
  int L_, V_;
};

class TokenFile : public DataSource {
 public:
  TokenFile(const Config& cfg, int dp) : L_(cfg.data.seq_len), V_(cfg.model.vocab_size) {
    const auto& d = cfg.data;
    global_batch_ = int64_t(d.micro_batch_size) * d.num_microbatches * dp;
    if (d.token_file.empty())
      throw InputError("data.token_file: task = \"tokens\" needs a token file");
    const int width = d.token_dtype == TokenDType::uint16 ? 2 : 4;
    std::ifstream in(d.token_file, std::ios::binary);
    if (!in) throw InputError("data.token_file: cannot open '" + d.token_file + "'");
    std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (raw.size() % size_t(width) != 0)
      throw InputError("data.token_file: '" + d.token_file + "' has " + std::to_string(raw.size()) +
                       " bytes, not a multiple of " + std::to_string(width) + " (" +
                       config_name(d.token_dtype) + ")");
    const size_t n = raw.size() / size_t(width);
    if (n < size_t(L_) + 1)
      throw InputError("data.token_file: '" + d.token_file + "' holds " + std::to_string(n) +
                       " tokens, shorter than one sample (data.seq_len + 1 = " +
                       std::to_string(L_ + 1) + ")");
    ids_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      uint32_t v = 0;
      if (width == 2) {
        uint16_t h;
        std::copy_n(raw.data() + 2 * i, 2, reinterpret_cast<char*>(&h));
        v = h;
      } else {
        std::copy_n(raw.data() + 4 * i, 4, reinterpret_cast<char*>(&v));
      }
      if (v >= uint32_t(V_))
        throw InputError("data.token_file: '" + d.token_file + "' token " + std::to_string(i) +
                         " is " + std::to_string(v) + ", not below model.vocab_size = " +
                         std::to_string(V_));
      ids_[i] = int32_t(v);
    }
  }
  Sample sample(int64_t step, int64_t g) const override {
    const int64_t span = int64_t(ids_.size()) - L_;  // windows start in [0, span)
    const int64_t start = ((step * global_batch_ + g) * L_) % span;
    Sample s;
    s.tokens.assign(ids_.begin() + start, ids_.begin() + start + L_);
    s.targets.assign(ids_.begin() + start + 1, ids_.begin() + start + L_ + 1);
    return s;
  }
  int64_t targets_per_sample() const override { return L_; }

 private:
  int L_, V_;
  int64_t global_batch_ = 1;
  std::vector<int32_t> ids_;
};

}  // namespace

std::unique_ptr<DataSource> make_data_source(const Config& cfg, int dp) {
  switch (cfg.data.task) {
    case DataTask::recall:
      return std::make_unique<RecallTask>(cfg);
    case DataTask::copy:
      return std::make_unique<CopyTask>(cfg);
    case DataTask::tokens:
      return std::make_unique<TokenFile>(cfg, dp);
  }
  throw InputError("data.task: no such task");
}

}  // namespace trident::model
