// Memory-mapped token files: flat ids and Megatron-LM's indexed dataset
// (see model/token_files.hpp; the layouts are in share/trident/data.md).
#include "trident/model/token_files.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "trident/core/error.hpp"

namespace trident::model {
namespace {

template <typename T>
std::string str(T v) {
  return std::to_string(v);
}

// Little-endian reads at any alignment (the .idx packs its fields unaligned).
template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

int64_t id_at(const unsigned char* p, int width, bool is_signed) {
  switch (width) {
    case 1:
      return is_signed ? int64_t(load<int8_t>(p)) : int64_t(load<uint8_t>(p));
    case 2:
      return is_signed ? int64_t(load<int16_t>(p)) : int64_t(load<uint16_t>(p));
    case 4:
      return is_signed ? int64_t(load<int32_t>(p)) : int64_t(load<uint32_t>(p));
    default:
      return load<int64_t>(p);
  }
}

// Every id of [begin, end) (byte offsets) in [0, vocab_size).
void check_ids(const MappedFile& f, size_t begin, size_t end, int width, bool is_signed,
               int vocab_size, const std::string& key) {
  for (size_t at = begin; at < end; at += size_t(width)) {
    const int64_t v = id_at(f.data() + at, width, is_signed);
    if (v < 0 || v >= vocab_size)
      throw InputError(key + ": '" + f.path() + "' byte offset " + str(at) + ": token id " +
                       str(v) + " is not in [0, model.vocab_size = " + str(vocab_size) + ")");
  }
}

// Megatron-LM's numeric dtype codes (indexed_dataset.py, DType).
struct MegatronDType {
  int width;
  bool is_signed;
  const char* name;
};
bool megatron_dtype(int code, MegatronDType& out) {
  switch (code) {
    case 1:
      out = {1, false, "uint8"};
      return true;
    case 2:
      out = {1, true, "int8"};
      return true;
    case 3:
      out = {2, true, "int16"};
      return true;
    case 4:
      out = {4, true, "int32"};
      return true;
    case 5:
      out = {8, true, "int64"};
      return true;
    case 8:
      out = {2, false, "uint16"};
      return true;
    default:  // 6 float64, 7 float32: not token ids
      return false;
  }
}

constexpr unsigned char kIdxMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr size_t kIdxHeader = 34;  // magic 9, version 8, dtype 1, sequences 8, documents 8

// The .idx header and where its arrays lie: lengths int32[n_seq], pointers
// int64[n_seq], document indices int64[n_doc], and in multimodal datasets
// modes int8[n_seq] (ignored).
struct IdxLayout {
  MegatronDType dt{};
  uint64_t n_seq = 0, n_doc = 0;
  size_t lengths_at = 0, pointers_at = 0, docs_at = 0;
};

InputError idx_error(const std::string& key, const std::string& path, size_t offset,
                     const std::string& rule) {
  return InputError(key + ": '" + path + "' byte offset " + str(offset) + ": " + rule);
}

IdxLayout read_idx_layout(const MappedFile& idx, const std::string& key) {
  auto bad = [&](size_t offset, const std::string& rule) {
    return idx_error(key, idx.path(), offset, rule);
  };
  if (idx.size() < kIdxHeader)
    throw bad(idx.size(),
              "the file ends inside the " + str(kIdxHeader) + "-byte header (not a Megatron .idx)");
  const unsigned char* p = idx.data();
  if (std::memcmp(p, kIdxMagic, sizeof kIdxMagic) != 0)
    throw bad(0, "bad magic: a Megatron .idx starts with \"MMIDIDX\\0\\0\"");
  if (const uint64_t version = load<uint64_t>(p + 9); version != 1)
    throw bad(9, "index version " + std::to_string(version) + ", only version 1 is read");
  IdxLayout l;
  if (!megatron_dtype(p[17], l.dt))
    throw bad(17, "dtype code " + str(int(p[17])) +
                      " is not a token id type (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 "
                      "uint16)");
  l.n_seq = load<uint64_t>(p + 18);
  l.n_doc = load<uint64_t>(p + 26);
  const uint64_t limit = uint64_t(1) << 40;
  if (l.n_seq > limit || l.n_doc > limit)
    throw bad(18, "sequence count " + std::to_string(l.n_seq) + " / document count " +
                      std::to_string(l.n_doc) + " is not plausible");
  l.lengths_at = kIdxHeader;
  l.pointers_at = l.lengths_at + 4 * l.n_seq;
  l.docs_at = l.pointers_at + 8 * l.n_seq;
  const size_t end = l.docs_at + 8 * l.n_doc;
  if (idx.size() != end && idx.size() != end + l.n_seq)
    throw bad(std::min(idx.size(), end),
              "the file has " + str(idx.size()) + " bytes; " + std::to_string(l.n_seq) +
                  " sequences and " + std::to_string(l.n_doc) + " document indices need " +
                  str(end) + " (or " + str(end + l.n_seq) + " with sequence modes)");
  if (l.n_doc < 1 || load<int64_t>(p + l.docs_at) != 0)
    throw bad(l.docs_at, "the document indices must start with 0");
  return l;
}

}  // namespace

MappedFile::MappedFile(const std::string& path, const std::string& what) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw InputError(what + ": cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(what + ": '" + path + "' is not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw InputError(what + ": cannot map '" + path + "': " + std::strerror(err));
    }
    data_ = static_cast<const unsigned char*>(p);
  }
  ::close(fd);  // the mapping stays valid
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

int64_t TokenCorpus::document_of(int64_t i) const {
  auto it = std::upper_bound(doc_begin_.begin(), doc_begin_.end(), i);
  return int64_t(it - doc_begin_.begin()) - 1;
}

int32_t TokenCorpus::token(int64_t i) const {
  return int32_t(id_at(bin_->data() + size_t(i) * size_t(width_), width_, signed_));
}

std::unique_ptr<TokenCorpus> TokenCorpus::open_flat(const std::string& path, TokenDType dtype,
                                                    int eod_token, int vocab_size,
                                                    const std::string& key) {
  std::unique_ptr<TokenCorpus> c(new TokenCorpus);
  c->name_ = path;
  c->bin_ = std::make_unique<MappedFile>(path, key);
  c->width_ = dtype == TokenDType::uint16 ? 2 : 4;
  const MappedFile& f = *c->bin_;
  if (f.size() % size_t(c->width_) != 0)
    throw InputError(key + ": '" + path + "' has " + str(f.size()) + " bytes, not a multiple of " +
                     str(c->width_) + " (" + config_name(dtype) + ")");
  c->n_tokens_ = int64_t(f.size() / size_t(c->width_));
  check_ids(f, 0, f.size(), c->width_, false, vocab_size, key);
  // A document ends with (and includes) its end-of-document token.
  c->doc_begin_.push_back(0);
  if (eod_token >= 0)
    for (int64_t i = 0; i + 1 < c->n_tokens_; ++i)
      if (c->token(i) == eod_token) c->doc_begin_.push_back(i + 1);
  if (c->n_tokens_ > 0) c->doc_begin_.push_back(c->n_tokens_);
  return c;
}

std::unique_ptr<TokenCorpus> TokenCorpus::open_megatron(const std::string& prefix, int vocab_size,
                                                        const std::string& key) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  MappedFile idx(idx_path, key);
  auto bad = [&](size_t offset, const std::string& rule) {
    return idx_error(key, idx_path, offset, rule);
  };
  const IdxLayout l = read_idx_layout(idx, key);
  const MegatronDType dt = l.dt;
  const uint64_t n_seq = l.n_seq, n_doc = l.n_doc;
  const size_t lengths_at = l.lengths_at, pointers_at = l.pointers_at, docs_at = l.docs_at;
  const unsigned char* p = idx.data();

  std::unique_ptr<TokenCorpus> c(new TokenCorpus);
  c->name_ = bin_path;
  c->bin_ = std::make_unique<MappedFile>(bin_path, key);
  c->width_ = dt.width;
  c->signed_ = dt.is_signed;
  const MappedFile& bin = *c->bin_;
  // Sequences lie back to back from byte 0 (Megatron's writer and merger
  // both store them so); token offset of each sequence's start:
  std::vector<int64_t> seq_begin(size_t(n_seq) + 1, 0);
  uint64_t expect = 0;
  for (uint64_t s = 0; s < n_seq; ++s) {
    const int32_t len = load<int32_t>(p + lengths_at + 4 * s);
    const int64_t ptr = load<int64_t>(p + pointers_at + 8 * s);
    if (len < 0)
      throw bad(lengths_at + 4 * s, "sequence " + std::to_string(s) + " has length " + str(len));
    if (ptr < 0 || uint64_t(ptr) != expect)
      throw bad(pointers_at + 8 * s, "sequence " + std::to_string(s) + " starts at byte " +
                                         str(ptr) + " of the .bin, expected " +
                                         std::to_string(expect) + " (sequences back to back)");
    expect += uint64_t(len) * uint64_t(dt.width);
    if (expect > bin.size())
      throw bad(pointers_at + 8 * s, "sequence " + std::to_string(s) + " (" + str(len) + " " +
                                         dt.name + " ids from byte " + str(ptr) +
                                         ") runs past the end of '" + bin_path + "' (" +
                                         str(bin.size()) + " bytes)");
    seq_begin[size_t(s) + 1] = int64_t(expect / uint64_t(dt.width));
  }
  if (expect != bin.size())
    throw InputError(key + ": '" + bin_path + "' byte offset " + std::to_string(expect) +
                     ": the file has " + str(bin.size()) + " bytes, but its index ends there");
  c->n_tokens_ = int64_t(expect / uint64_t(dt.width));
  check_ids(bin, 0, bin.size(), dt.width, dt.is_signed, vocab_size, key);
  // Document k is the sequences [indices[k], indices[k+1]); empty ones are dropped.
  c->doc_begin_.push_back(0);
  int64_t prev = 0;
  for (uint64_t k = 1; k < n_doc; ++k) {
    const int64_t s = load<int64_t>(p + docs_at + 8 * k);
    if (s < prev || uint64_t(s) > n_seq)
      throw bad(docs_at + 8 * k, "document index " + std::to_string(k) + " is " + str(s) +
                                     ", outside [" + str(prev) + ", " + std::to_string(n_seq) +
                                     "] (indices rise to the sequence count)");
    prev = s;
    if (seq_begin[size_t(s)] > c->doc_begin_.back()) c->doc_begin_.push_back(seq_begin[size_t(s)]);
  }
  if (c->doc_begin_.back() != c->n_tokens_) c->doc_begin_.push_back(c->n_tokens_);
  if (c->n_tokens_ == 0) c->doc_begin_.resize(1);
  return c;
}

}  // namespace trident::model
