// Sharded checkpoints: shard files written with POSIX calls into datasets
// HDF5 allocated, and the index of virtual datasets over them (see
// io/sharded_checkpoint.hpp).
#include "trident/io/sharded_checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "trident/core/error.hpp"
#include "trident/io/h5util.hpp"

namespace trident {
namespace {

constexpr uint64_t kFnvBasis = 1469598103934665603ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;

[[noreturn]] void system_error(const std::string& what, const std::string& path, int err) {
  throw Error("cannot " + what + " " + path + ": " + std::strerror(err));
}

// HDF5 writes a file's metadata when it is closed, and a close that fails
// (a full disk) leaves the library with a half-closed file that crashes it
// at exit: so the space a file needs is asked of the system first, and a
// full or read-only file system is refused with its own reason before HDF5
// writes anything. (The floats themselves go in with pwrite, whose errors
// are the system's.)
void ensure_space(const std::string& path, int64_t bytes) {
  struct statvfs fs {};
  const std::string d = std::filesystem::path(path).parent_path().string();
  if (::statvfs(d.empty() ? "." : d.c_str(), &fs) != 0) return;
  if (fs.f_flag & ST_RDONLY) system_error("write", path, EROFS);
  const uint64_t blocks = ::geteuid() == 0 ? fs.f_bfree : fs.f_bavail;
  if (blocks * uint64_t(fs.f_frsize) < uint64_t(bytes)) system_error("write", path, ENOSPC);
}

// Metadata of a file of n datasets, generously: object headers, attributes,
// group heaps, and for a virtual dataset its mappings.
// (Measured: about 330 bytes a shard dataset with its five attributes.)
int64_t metadata_bytes(size_t datasets, size_t mappings) {
  return (int64_t(1) << 14) + 1024 * int64_t(datasets) + 256 * int64_t(mappings);
}

std::string dir_of(const std::string& path) {
  const std::string d = std::filesystem::path(path).parent_path().string();
  return d.empty() ? "." : d;
}

void fsync_dir(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  ::fsync(dfd);
  ::close(dfd);
}

// The step of "ckpt_step_NNNNNNNN<rest>", or -1.
int64_t step_of(const std::string& file, std::string* rest) {
  if (file.rfind("ckpt_step_", 0) != 0 || file.size() < 18) return -1;
  for (size_t i = 10; i < 18; ++i)
    if (file[i] < '0' || file[i] > '9') return -1;
  if (rest) *rest = file.substr(18);
  return std::stoll(file.substr(10, 8));
}

bool is_shard_name(const std::string& file, int64_t& step) {
  std::string rest;
  step = step_of(file, &rest);
  return step >= 0 && rest.size() > 3 && rest.substr(rest.size() - 3) == ".h5" &&
         rest.find(".shard") != std::string::npos && rest.find(".tmp") == std::string::npos;
}

}  // namespace

// Running checksums of one piece: of all its bytes, and of each block.
struct ShardFile::Progress {
  int64_t written = 0;
  uint64_t whole = kFnvBasis, block = kFnvBasis;
  std::vector<uint64_t> blocks;

  void add(const float* x, int64_t n) {
    while (n > 0) {
      const int64_t room = kChecksumBlock - written % kChecksumBlock;
      const int64_t take = std::min(n, room);
      const auto* b = reinterpret_cast<const unsigned char*>(x);
      const size_t len = size_t(take) * sizeof(float);
      uint64_t w = whole, k = block;
      for (size_t i = 0; i < len; ++i) {
        w = (w ^ b[i]) * kFnvPrime;
        k = (k ^ b[i]) * kFnvPrime;
      }
      whole = w;
      block = k;
      written += take;
      x += take;
      n -= take;
      if (written % kChecksumBlock == 0) close_block();
    }
  }
  void close_block() {
    blocks.push_back(block);
    block = kFnvBasis;
  }
};

std::string shard_file_name(int64_t step, const std::string& tag, int rank) {
  char name[96];
  std::snprintf(name, sizeof name, "ckpt_step_%08lld.%s.shard%05d.h5", static_cast<long long>(step),
                tag.c_str(), rank);
  return name;
}

namespace {

// uint64 attributes of a fixed size, created once with zeros and later
// rewritten in place: finish() then changes no size in the file, so the
// HDF5 close that records the checksums allocates no new space (a disk that
// filled meanwhile cannot fail it).
void create_u64_attr(hid_t obj, const char* name, size_t n) {
  hsize_t dims[1] = {hsize_t(n)};
  h5::Handle space = n == 0 ? TRIDENT_H5_SPACE(H5Screate(H5S_SCALAR), "scalar space")
                            : TRIDENT_H5_SPACE(H5Screate_simple(1, dims, nullptr), "1-d space");
  h5::Handle a =
      TRIDENT_H5_ATTR(H5Acreate2(obj, name, H5T_STD_U64LE, space, H5P_DEFAULT, H5P_DEFAULT), name);
  const std::vector<uint64_t> zeros(std::max<size_t>(n, 1), 0);
  TRIDENT_H5(H5Awrite(a, H5T_NATIVE_UINT64, zeros.data()), name);
}

void rewrite_u64_attr(hid_t obj, const char* name, const uint64_t* values) {
  h5::Handle a = TRIDENT_H5_ATTR(H5Aopen(obj, name, H5P_DEFAULT), name);
  TRIDENT_H5(H5Awrite(a, H5T_NATIVE_UINT64, values), name);
}

// A 1-D float dataset of n elements, allocated at creation and never filled,
// contiguous: its bytes lie at one offset of the file (H5Dget_offset).
int64_t create_piece_dataset(hid_t file, const ShardPiece& p) {
  hsize_t dims[1] = {hsize_t(p.numel())};
  h5::Handle space = TRIDENT_H5_SPACE(H5Screate_simple(1, dims, nullptr), "dataspace of " + p.name);
  h5::Handle lcpl = TRIDENT_H5_PLIST(H5Pcreate(H5P_LINK_CREATE), "link creation list");
  TRIDENT_H5(H5Pset_create_intermediate_group(lcpl, 1), "intermediate groups");
  h5::Handle dcpl = TRIDENT_H5_PLIST(H5Pcreate(H5P_DATASET_CREATE), "dataset creation list");
  TRIDENT_H5(H5Pset_layout(dcpl, H5D_CONTIGUOUS), "contiguous layout");
  TRIDENT_H5(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY), "early allocation");
  TRIDENT_H5(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), "no fill");
  h5::Handle d = TRIDENT_H5_DSET(H5Dcreate2(file, ("tensors/" + p.name).c_str(), H5T_IEEE_F32LE,
                                            space, lcpl, dcpl, H5P_DEFAULT),
                                 "create " + p.name);
  h5::write_attr(d, "begin", p.begin);
  h5::write_attr(d, "end", p.end);
  h5::write_attr(d, "shape", p.shape);
  create_u64_attr(d, "fnv1a64", 0);
  create_u64_attr(d, "fnv1a64_blocks", size_t((p.numel() + kChecksumBlock - 1) / kChecksumBlock));
  const haddr_t at = H5Dget_offset(d);
  TRIDENT_CHECK(at != HADDR_UNDEF, "shard: no file offset for " + p.name);
  return int64_t(at);
}

void write_shard_root(hid_t file, const CheckpointMeta& meta, const std::string& tag, int rank) {
  h5::write_attr(file, "format", "trident-checkpoint-shard");
  h5::write_attr(file, "format_version", int64_t{3});
  h5::write_attr(file, "step", meta.step);
  h5::write_attr(file, "rank", int64_t{rank});
  h5::write_attr(file, "shard_tag", tag);
  h5::write_attr(file, "model_hash", meta.model_hash);
  create_u64_attr(file, "complete", 0);  // 1 once every checksum is in
}

// Why the system refused a write to path, when HDF5's own text does not say
// (a full or read-only file system); "" when it does not either.
std::string system_refusal(const std::string& path) {
  struct statvfs fs {};
  const std::string d = std::filesystem::path(path).parent_path().string();
  if (::statvfs(d.empty() ? "." : d.c_str(), &fs) != 0) return "";
  if (fs.f_flag & ST_RDONLY) return std::strerror(EROFS);
  if ((::geteuid() == 0 ? fs.f_bfree : fs.f_bavail) == 0) return std::strerror(ENOSPC);
  return "";
}

[[noreturn]] void hdf5_write_error(const std::string& path) {
  const std::string why = system_refusal(path);
  throw Error("cannot write " + path + ": " + (why.empty() ? h5::error_text() : why));
}

}  // namespace

int64_t shard_file_bytes(const std::vector<ShardPiece>& pieces) {
  int64_t data = 0;
  for (const ShardPiece& p : pieces) data += p.numel() * int64_t(sizeof(float));
  return data + metadata_bytes(pieces.size(), 0);
}

int64_t index_file_bytes(const std::vector<std::vector<ShardPiece>>& pieces) {
  size_t n = 0, mappings = 0;
  for (const auto& rank : pieces)
    for (const ShardPiece& p : rank) {
      ++n;
      mappings += 2 * p.shape.size();
    }
  return metadata_bytes(n, mappings);
}

ShardFile::ShardFile(std::string path, const CheckpointMeta& meta, const std::string& tag, int rank,
                     std::vector<ShardPiece> pieces, int64_t need_free)
    : path_(std::move(path)), pieces_(std::move(pieces)) {
  ensure_space(path_, std::max(need_free, shard_file_bytes(pieces_)));
  {
    h5::Lock lock(h5::library_mutex());
    h5::QuietErrors quiet;
    const hid_t f = H5Fcreate(path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) system_error("create", path_, errno ? errno : EIO);
    h5::Handle file(f, H5Fclose);
    try {
      write_shard_root(file, meta, tag, rank);
      for (const ShardPiece& p : pieces_) offsets_.push_back(create_piece_dataset(file, p));
    } catch (const std::exception& e) {
      file.reset();
      std::remove(path_.c_str());
      throw Error("cannot create " + path_ + ": " + e.what());
    }
    if (H5Fclose(file.release()) < 0) {
      std::remove(path_.c_str());
      hdf5_write_error(path_);
    }
  }
  for (size_t i = 0; i < pieces_.size(); ++i) progress_.push_back(new Progress());
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) system_error("open", path_, errno);
}

ShardFile::~ShardFile() {
  for (Progress* p : progress_) delete p;
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) std::remove(path_.c_str());
}

void ShardFile::append(size_t i, const float* data, int64_t n) {
  Progress& pr = *progress_.at(i);
  const ShardPiece& p = pieces_[i];
  TRIDENT_CHECK(pr.written + n <= p.numel(),
                "shard: more elements than piece " + p.name + " holds");
  for (int64_t j = 0; j < n; ++j)
    if (!std::isfinite(data[j]))
      throw Error("tensor " + p.name + " holds a NaN or an infinity; not written");
  const char* src = reinterpret_cast<const char*>(data);
  size_t left = size_t(n) * sizeof(float);
  off_t at = off_t(offsets_[i] + pr.written * int64_t(sizeof(float)));
  while (left > 0) {
    const ssize_t w = ::pwrite(fd_, src, left, at);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) system_error("write", path_, errno);
    src += w;
    at += w;
    left -= size_t(w);
  }
  pr.add(data, n);
  bytes_ += n * int64_t(sizeof(float));
}

void ShardFile::finish() {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    TRIDENT_CHECK(progress_[i]->written == pieces_[i].numel(),
                  "shard: piece " + pieces_[i].name + " not completely written");
    if (progress_[i]->written % kChecksumBlock != 0) progress_[i]->close_block();
  }
  if (::fsync(fd_) != 0) system_error("sync", path_, errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    system_error("close", path_, errno);
  }
  fd_ = -1;
  {
    h5::Lock lock(h5::library_mutex());
    h5::QuietErrors quiet;
    const hid_t f = H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) throw Error("cannot reopen " + path_ + ": " + h5::error_text());
    h5::Handle file(f, H5Fclose);
    for (size_t i = 0; i < pieces_.size(); ++i) {
      h5::Handle d =
          TRIDENT_H5_DSET(H5Dopen2(file, ("tensors/" + pieces_[i].name).c_str(), H5P_DEFAULT),
                          "open " + pieces_[i].name);
      rewrite_u64_attr(d, "fnv1a64", &progress_[i]->whole);
      rewrite_u64_attr(d, "fnv1a64_blocks", progress_[i]->blocks.data());
    }
    const uint64_t one = 1;
    rewrite_u64_attr(file, "complete", &one);
    if (H5Fclose(file.release()) < 0) hdf5_write_error(path_);
  }
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) system_error("open", path_, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) system_error("sync", path_, err);
  finished_ = true;
}

namespace {

// A flat range [a, b) of a tensor of `shape` as hyperslab blocks in
// row-major order (at most 2 * ndim - 1 of them): start and count per block.
struct Block {
  std::vector<hsize_t> start, count;
  int64_t numel() const {
    int64_t n = 1;
    for (hsize_t c : count) n *= int64_t(c);
    return n;
  }
};

void blocks_of(const std::vector<int64_t>& shape, size_t d, int64_t a, int64_t b,
               std::vector<hsize_t> prefix, std::vector<Block>& out) {
  if (a >= b) return;
  if (d + 1 == shape.size()) {
    Block blk{prefix, std::vector<hsize_t>(prefix.size(), 1)};
    blk.start.push_back(hsize_t(a));
    blk.count.push_back(hsize_t(b - a));
    out.push_back(std::move(blk));
    return;
  }
  int64_t inner = 1;
  for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  int64_t r0 = a / inner;
  const int64_t r1 = b / inner;  // rows [r0, r1) may be whole
  auto sub = [&](int64_t row, int64_t lo, int64_t hi) {
    std::vector<hsize_t> p = prefix;
    p.push_back(hsize_t(row));
    blocks_of(shape, d + 1, lo, hi, p, out);
  };
  if (a % inner != 0) {
    sub(r0, a % inner, r0 == b / inner ? b % inner : inner);
    if (r0 == b / inner) return;
    ++r0;
  }
  if (r1 > r0) {
    Block blk{prefix, std::vector<hsize_t>(prefix.size(), 1)};
    blk.start.push_back(hsize_t(r0));
    blk.count.push_back(hsize_t(r1 - r0));
    for (size_t k = d + 1; k < shape.size(); ++k) {
      blk.start.push_back(0);
      blk.count.push_back(hsize_t(shape[k]));
    }
    out.push_back(std::move(blk));
  }
  if (b % inner != 0) sub(r1, 0, b % inner);
}

// One tensor of the index: its shape and its pieces as (rank, begin, end).
struct IndexEntry {
  std::vector<int64_t> shape;
  std::vector<int64_t> pieces;
};

std::map<std::string, IndexEntry> index_entries(const std::vector<std::vector<ShardPiece>>& all) {
  std::map<std::string, IndexEntry> by_name;
  for (size_t r = 0; r < all.size(); ++r)
    for (const ShardPiece& p : all[r]) {
      IndexEntry& e = by_name[p.name];
      e.shape = p.shape;
      e.pieces.insert(e.pieces.end(), {int64_t(r), p.begin, p.end});
    }
  for (auto& [name, e] : by_name) {  // the pieces must tile the tensor once
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (size_t i = 0; i < e.pieces.size(); i += 3)
      ranges.push_back({e.pieces[i + 1], e.pieces[i + 2]});
    std::sort(ranges.begin(), ranges.end());
    int64_t at = 0, numel = 1;
    for (int64_t d : e.shape) numel *= d;
    for (const auto& [b, en] : ranges) {
      TRIDENT_CHECK(b == at, "checkpoint: the pieces of " + name + " overlap or leave a gap");
      at = en;
    }
    TRIDENT_CHECK(at == numel, "checkpoint: the pieces of " + name + " do not cover it");
  }
  return by_name;
}

// The virtual dataset of one tensor: every piece's blocks mapped onto the
// consecutive elements of its shard dataset.
void write_virtual(hid_t group, const std::string& name, const IndexEntry& e,
                   const std::vector<std::string>& shards) {
  std::vector<hsize_t> dims(e.shape.begin(), e.shape.end());
  h5::Handle space = TRIDENT_H5_SPACE(H5Screate_simple(int(dims.size()), dims.data(), nullptr),
                                      "dataspace of " + name);
  h5::Handle dcpl = TRIDENT_H5_PLIST(H5Pcreate(H5P_DATASET_CREATE), "dataset creation list");
  const float nan = std::numeric_limits<float>::quiet_NaN();  // a missing shard reads as NaN
  TRIDENT_H5(H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &nan), "fill value");
  for (size_t i = 0; i < e.pieces.size(); i += 3) {
    const int64_t rank = e.pieces[i], b = e.pieces[i + 1], en = e.pieces[i + 2];
    std::vector<Block> blocks;
    blocks_of(e.shape, 0, b, en, {}, blocks);
    hsize_t src_dims[1] = {hsize_t(en - b)};
    hsize_t off = 0;
    for (const Block& blk : blocks) {
      h5::Handle vsel = TRIDENT_H5_SPACE(H5Scopy(space), "virtual selection");
      TRIDENT_H5(H5Sselect_hyperslab(vsel, H5S_SELECT_SET, blk.start.data(), nullptr,
                                     blk.count.data(), nullptr),
                 "virtual block of " + name);
      h5::Handle src = TRIDENT_H5_SPACE(H5Screate_simple(1, src_dims, nullptr), "source space");
      hsize_t cnt[1] = {hsize_t(blk.numel())};
      TRIDENT_H5(H5Sselect_hyperslab(src, H5S_SELECT_SET, &off, nullptr, cnt, nullptr),
                 "source block of " + name);
      TRIDENT_H5(H5Pset_virtual(dcpl, vsel, shards.at(size_t(rank)).c_str(),
                                ("/tensors/" + name).c_str(), src),
                 "map " + name);
      off += cnt[0];
    }
  }
  h5::Handle lcpl = TRIDENT_H5_PLIST(H5Pcreate(H5P_LINK_CREATE), "link creation list");
  TRIDENT_H5(H5Pset_create_intermediate_group(lcpl, 1), "intermediate groups");
  h5::Handle d = TRIDENT_H5_DSET(
      H5Dcreate2(group, name.c_str(), H5T_IEEE_F32LE, space, lcpl, dcpl, H5P_DEFAULT),
      "create " + name);
  h5::write_attr(d, "pieces", e.pieces);
}

void write_index_root(hid_t file, const CheckpointMeta& meta, const std::string& tag,
                      const std::vector<std::string>& shards) {
  write_checkpoint_attrs(file, meta, 3);
  h5::write_attr(file, "shard_tag", tag);
  h5::write_attr(file, "shards", shards);
}

}  // namespace

std::string write_index_tmp(const std::string& dir, const CheckpointMeta& meta,
                            const std::string& tag,
                            const std::vector<std::vector<ShardPiece>>& pieces) {
  const std::string tmp = checkpoint_path(dir, meta.step) + ".tmp." + std::to_string(::getpid());
  std::vector<std::string> shards;
  for (size_t r = 0; r < pieces.size(); ++r)
    shards.push_back(shard_file_name(meta.step, tag, int(r)));
  const std::map<std::string, IndexEntry> entries = index_entries(pieces);
  // The index holds metadata only: it is built in memory (HDF5's core
  // driver) and written with POSIX calls, whose errors are the system's.
  std::vector<char> image;
  {
    h5::Lock lock(h5::library_mutex());
    h5::QuietErrors quiet;
    h5::Handle fapl = TRIDENT_H5_PLIST(H5Pcreate(H5P_FILE_ACCESS), "file access list");
    TRIDENT_H5(H5Pset_fapl_core(fapl, size_t(1) << 20, false), "in-memory file driver");
    h5::Handle file(TRIDENT_H5(H5Fcreate("index-image", H5F_ACC_TRUNC, H5P_DEFAULT, fapl),
                               "create index image"),
                    H5Fclose);
    write_index_root(file, meta, tag, shards);
    h5::Handle g = h5::open_or_create_group(file, "tensors");
    for (const auto& [name, e] : entries) write_virtual(g, name, e, shards);
    h5::write_attr(file, "tensor_count", int64_t(entries.size()));
    g.reset();
    TRIDENT_H5(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush index image");
    const ssize_t size = TRIDENT_H5(H5Fget_file_image(file, nullptr, 0), "index image size");
    image.resize(size_t(size));
    TRIDENT_H5(H5Fget_file_image(file, image.data(), image.size()), "index image");
  }
  try {
    write_file_durably(tmp, image);
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  return tmp;
}

void commit_index(const std::string& tmp, const std::string& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) system_error("rename " + tmp + " to", path, errno);
  fsync_dir(dir_of(path));
}

std::vector<std::string> checkpoint_files(const std::string& index_path) {
  std::vector<std::string> files{index_path};
  h5::Lock lock(h5::library_mutex());
  h5::QuietErrors quiet;
  const hid_t f = H5Fopen(index_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return files;
  h5::Handle file(f, H5Fclose);
  if (H5Aexists(file, "shards") <= 0) return files;
  const std::string dir = dir_of(index_path);
  for (const std::string& s : h5::read_string_list_attr(file, "shards"))
    files.push_back((std::filesystem::path(dir) / s).string());
  return files;
}

void remove_checkpoint(const std::string& index_path) {
  for (const std::string& f : checkpoint_files(index_path)) std::remove(f.c_str());
  fsync_dir(dir_of(index_path));
}

std::vector<std::string> remove_unindexed_shards(const std::string& dir, int64_t max_step) {
  std::set<std::string> named;
  for (const std::string& idx : checkpoints_newest_first(dir))
    for (const std::string& f : checkpoint_files(idx))
      named.insert(std::filesystem::path(f).filename().string());
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    int64_t step = -1;
    std::string rest;
    const bool tmp_index = (step = step_of(n, &rest)) >= 0 && rest.rfind(".h5.tmp.", 0) == 0;
    if (!tmp_index && !is_shard_name(n, step)) continue;
    if (step > max_step || named.count(n)) continue;
    std::remove(e.path().c_str());
    removed.push_back(e.path().string());
  }
  return removed;
}

int64_t checkpoint_step(const std::string& path) {
  return step_of(std::filesystem::path(path).filename().string(), nullptr);
}

std::vector<int64_t> unindexed_steps(const std::string& dir) {
  std::set<int64_t> with_index, with_shards;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    int64_t step = -1;
    std::string rest;
    if (is_shard_name(n, step))
      with_shards.insert(step);
    else if ((step = step_of(n, &rest)) >= 0 && rest == ".h5")
      with_index.insert(step);
  }
  std::vector<int64_t> out;
  for (int64_t s : with_shards)
    if (!with_index.count(s)) out.push_back(s);
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace trident
