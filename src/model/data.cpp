// Synthetic tasks and the token-file reader (see model/data.hpp).
#include "trident/model/data.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>

#include "trident/core/error.hpp"
#include "trident/core/rng.hpp"
#include "trident/model/token_files.hpp"

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
    for (int i = 1; i < half; ++i)
      s.tokens[size_t(i)] = 1 + int(rng::below(key, uint64_t(i), uint64_t(V_ - 1)));
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

// Where data.split cuts n documents: training [0, b1), validation [b1, b2).
// Megatron's rule (BlendedMegatronDatasetBuilder): the shares normalised,
// summed into bookends, each bookend times n rounded half to even (Python's
// round), so a split cuts at the document Megatron's would, ties included.
std::pair<int64_t, int64_t> split_bounds(int64_t n, const std::array<double, 3>& shares) {
  const double total = shares[0] + shares[1] + shares[2];
  const double v0 = shares[0] / total, v1 = shares[1] / total;
  return {int64_t(std::nearbyint(v0 * double(n))), int64_t(std::nearbyint((v0 + v1) * double(n)))};
}

// One dataset's part of data.split: documents [d0, d1) = tokens [t0, t1).
struct Part {
  const TokenCorpus* corpus = nullptr;
  int64_t d0 = 0, d1 = 0, t0 = 0, t1 = 0;
};

// The documents of c that `which` reads: its share of data.split, or all of
// it (own_eval: a validation file of its own). InputError naming key when
// they hold less than one sample (data.seq_len + 1 tokens).
Part part_of(const TokenCorpus& c, const DataConfig& d, DataPart which, bool own_eval,
             const std::string& key) {
  Part part{&c, 0, c.n_documents(), 0, 0};
  std::string what = "holds";
  if (!own_eval) {
    const auto [b1, b2] = split_bounds(c.n_documents(), data_split_shares(d.split));
    part.d0 = which == DataPart::train ? 0 : b1;
    part.d1 = which == DataPart::train ? b1 : b2;
    if (part.d1 - part.d0 != c.n_documents())
      what = std::string("has in its ") + (which == DataPart::train ? "training" : "validation") +
             " share of data.split = \"" + d.split + "\" (" + std::to_string(part.d1 - part.d0) +
             " of " + std::to_string(c.n_documents()) + " documents)";
  }
  part.t0 = c.doc_begin(part.d0);
  part.t1 = c.doc_begin(part.d1);
  if (part.t1 - part.t0 < int64_t(d.seq_len) + 1)
    throw InputError(
        key + ": '" + c.name() + "' " + what + " " + std::to_string(part.t1 - part.t0) +
        " tokens, shorter than one sample (data.seq_len + 1 = " + std::to_string(d.seq_len + 1) +
        ")");
  return part;
}

// Windows of a token stream: one dataset or a blend (see model/data.hpp).
class TokenStream : public DataSource {
 public:
  TokenStream(const Config& cfg, int dp, DataPart which)
      : L_(cfg.data.seq_len),
        packed_(cfg.data.packing == Packing::documents),
        reset_positions_(cfg.data.reset_positions) {
    const auto& d = cfg.data;
    global_batch_ = int64_t(d.micro_batch_size) * d.num_microbatches * dp;
    const bool megatron = d.format == DataFormat::megatron;
    const bool own_eval = which == DataPart::validation && !cfg.eval.uses_split();
    std::vector<DataConfig::BlendEntry> sets = d.blend;
    std::string key = "data.blend";
    if (own_eval) {
      sets = {{1.0, megatron ? cfg.eval.prefix : cfg.eval.token_file}};
      key = megatron ? "eval.prefix" : "eval.token_file";
    } else if (sets.empty()) {
      sets = {{1.0, megatron ? d.prefix : d.token_file}};
      key = megatron ? "data.prefix" : "data.token_file";
    }
    std::vector<double> weights;
    for (const auto& set : sets) {
      corpora_.push_back(megatron ? TokenCorpus::open_megatron(set.path, cfg.model.vocab_size, key)
                                  : TokenCorpus::open_flat(set.path, d.token_dtype, d.eod_token,
                                                           cfg.model.vocab_size, key));
      parts_.push_back(part_of(*corpora_.back(), d, which, own_eval, key));
      weights.push_back(set.weight);
    }
    order_ = make_blend_order(weights, parts_.size() == 1 ? 1 : kBlendBlock);
    before_.assign(parts_.size(), std::vector<int64_t>(order_.size() + 1, 0));
    for (size_t p = 0; p < parts_.size(); ++p)
      for (size_t j = 0; j < order_.size(); ++j)
        before_[p][j + 1] = before_[p][j] + (order_[j] == int(p) ? 1 : 0);
  }

  Sample sample(int64_t step, int64_t g) const override {
    const auto [part, start] = window(step, g);
    const TokenCorpus& c = *part->corpus;
    Sample s;
    s.tokens.resize(size_t(L_));
    s.targets.resize(size_t(L_));
    for (int p = 0; p < L_; ++p) {
      s.tokens[size_t(p)] = c.token(start + p);
      s.targets[size_t(p)] = c.token(start + p + 1);
    }
    if (!packed_) return s;
    s.doc_ids.resize(size_t(L_));
    if (reset_positions_) s.positions.resize(size_t(L_));
    int64_t doc = c.document_of(start), next = c.doc_begin(doc + 1);
    int32_t id = 0, first = 0;
    for (int p = 0; p < L_; ++p) {
      if (start + p == next) {  // a document begins at p
        ++id;
        first = p;
        next = c.doc_begin(++doc + 1);
      }
      s.doc_ids[size_t(p)] = id;
      if (reset_positions_) s.positions[size_t(p)] = p - first;
      if (start + p + 1 == next) s.targets[size_t(p)] = -1;  // p ends its document
    }
    return s;
  }

  int64_t targets_per_sample() const override { return L_; }

  int64_t targets_in_batch(int64_t step, int64_t n_samples) const override {
    if (!packed_) return n_samples * L_;
    int64_t n = 0;
    for (int64_t g = 0; g < n_samples; ++g) {
      const auto [part, start] = window(step, g);
      // one target lost for each document beginning in (start, start + L]
      const TokenCorpus& c = *part->corpus;
      n += L_ - (c.document_of(start + L_) - c.document_of(start));
    }
    return n;
  }

  std::vector<int64_t> document_lengths_log2() const override {
    std::vector<int64_t> bins;
    for (const Part& p : parts_)
      for (int64_t d = p.d0; d < p.d1; ++d)
        add_log2_length(bins, p.corpus->doc_begin(d + 1) - p.corpus->doc_begin(d));
    return bins;
  }

 private:
  static constexpr int kBlendBlock = 1000;

  // The part and first token of sample g of step.
  std::pair<const Part*, int64_t> window(int64_t step, int64_t g) const {
    const int64_t i = step * global_batch_ + g;
    const int64_t B = int64_t(order_.size()), j = i % B;
    const size_t d = size_t(order_[size_t(j)]);
    const int64_t k = (i / B) * before_[d][size_t(B)] + before_[d][size_t(j)];
    const Part& p = parts_[d];
    const int64_t span = p.t1 - p.t0 - L_;  // windows start in [t0, t0 + span)
    return {&p, p.t0 + (k * L_) % span};
  }

  int L_;
  bool packed_, reset_positions_;
  int64_t global_batch_ = 1;
  std::vector<std::unique_ptr<TokenCorpus>> corpora_;
  std::vector<Part> parts_;
  std::vector<int> order_;                    // the blend's interleaving of one block
  std::vector<std::vector<int64_t>> before_;  // [part][j]: samples of part in order_[0, j)
};

}  // namespace

std::unique_ptr<DataSource> make_data_source(const Config& cfg, int dp, DataPart part) {
  switch (cfg.data.task) {
    case DataTask::recall:
      return std::make_unique<RecallTask>(cfg);
    case DataTask::copy:
      return std::make_unique<CopyTask>(cfg);
    case DataTask::tokens:
      return std::make_unique<TokenStream>(cfg, dp, part);
  }
  throw InputError("data.task: no such task");
}

void add_log2_length(std::vector<int64_t>& bins, int64_t length) {
  if (length <= 0) return;
  size_t b = 0;
  while ((int64_t(1) << (b + 1)) <= length) ++b;
  if (bins.size() <= b) bins.resize(b + 1, 0);
  ++bins[b];
}

std::vector<int> make_blend_order(const std::vector<double>& weights, int block) {
  double total = 0;
  for (double w : weights) total += w;
  std::vector<double> taken(weights.size(), 0);
  std::vector<int> order(static_cast<size_t>(block));
  // Greedy: each sample goes to the dataset furthest behind its share so
  // far, measured as Megatron's build_blending_indices measures it (share
  // times max(j, 1), ties to the first), so a block starts as Megatron's
  // blend does.
  for (int j = 0; j < block; ++j) {
    size_t best = 0;
    double best_gap = -1e300;
    for (size_t d = 0; d < weights.size(); ++d) {
      const double gap = weights[d] / total * double(std::max(j, 1)) - taken[d];
      if (gap > best_gap) {
        best_gap = gap;
        best = d;
      }
    }
    order[size_t(j)] = int(best);
    taken[best] += 1;
  }
  return order;
}

}  // namespace trident::model
