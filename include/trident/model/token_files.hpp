// Token files on disk, read through a memory map (never loaded whole): a
// flat file of ids (nanoGPT-style .bin, data.format = "flat") whose
// documents end with data.eod_token, or Megatron-LM's indexed dataset
// (PREFIX.bin + PREFIX.idx, data.format = "megatron") whose .idx lists them.
// Layouts: share/trident/data.md.
//
// Opening a corpus checks the whole of it once (the index against the data
// file, every id below the vocabulary) and throws InputError with one line
// naming the file, the byte offset and the rule; after that, reads cannot fail.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trident/core/config.hpp"

namespace trident::model {

// A read-only memory map of a whole file (an empty file maps to nothing).
class MappedFile {
 public:
  // InputError "<what> '<path>': cannot open ..." when it cannot be mapped.
  MappedFile(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// One dataset: a stream of token ids cut into documents. Document d is the
// tokens [doc_begin(d), doc_begin(d + 1)); documents are never empty.
class TokenCorpus {
 public:
  // key: the config key that named it, for messages ("data.token_file").
  static std::unique_ptr<TokenCorpus> open_flat(const std::string& path, TokenDType dtype,
                                                int eod_token, int vocab_size,
                                                const std::string& key);
  static std::unique_ptr<TokenCorpus> open_megatron(const std::string& prefix, int vocab_size,
                                                    const std::string& key);

  const std::string& name() const { return name_; }  // the file (flat) or the .bin
  int64_t n_tokens() const { return n_tokens_; }
  int64_t n_documents() const { return int64_t(doc_begin_.size()) - 1; }
  int64_t doc_begin(int64_t d) const { return doc_begin_[size_t(d)]; }
  // The document holding token i (0 <= i < n_tokens()).
  int64_t document_of(int64_t i) const;
  int32_t token(int64_t i) const;

 private:
  TokenCorpus() = default;
  std::string name_;
  std::unique_ptr<MappedFile> bin_;
  int width_ = 2;        // bytes per id
  bool signed_ = false;  // Megatron's int8/int16/int32/int64 codes
  int64_t n_tokens_ = 0;
  std::vector<int64_t> doc_begin_;  // [n_documents + 1], increasing, last = n_tokens
};

}  // namespace trident::model
