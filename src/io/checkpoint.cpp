// Checkpoint files: gather to rank 0, serial HDF5 write to a temporary name,
// rename; per-rank reads with checksums (see io/checkpoint.hpp).
#include "trident/io/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "trident/core/error.hpp"
#include "trident/io/h5util.hpp"
#include "trident/io/sharded_checkpoint.hpp"

namespace trident {
namespace {

// The single file: 2, every weight matrix stored [out, in] (1 stored the
// SwiGLU and router weights [in, out]; a square one would load silently
// transposed). 3 is the sharded index (io/sharded_checkpoint.hpp).
constexpr int64_t kSingleFormatVersion = 2;
constexpr int64_t kFormatVersion = 3;

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// One tensor as rank 0 writes it: its own tensors where they lie, the other
// ranks' inside the buffers they sent (no copy of the floats on either side).
struct View {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  int64_t numel() const { return trident::numel(shape); }
};

// name, ndim, dims, floats: one record per tensor, the name padded to a
// multiple of 8 bytes so that every field, the floats included, lies at a
// multiple of 8 from the buffer's start (rank 0 reads the floats in place).
int64_t padded(int64_t len) { return (len + 7) / 8 * 8; }

int64_t record_bytes(const CheckpointTensor& t) {
  return 8 + padded(int64_t(t.name.size())) + 8 + 8 * int64_t(t.shape.size()) +
         numel(t.shape) * int64_t(sizeof(float));
}

// The records of `tensors`, in one buffer sized once.
std::vector<char> pack(const std::vector<CheckpointTensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += record_bytes(t);
  std::vector<char> buf(size_t(bytes), 0);
  char* out = buf.data();
  auto put = [&](const void* p, size_t n) {
    if (n > 0) std::memcpy(out, p, n);
    out += n;
  };
  for (const auto& t : tensors) {
    const int64_t len = int64_t(t.name.size()), nd = int64_t(t.shape.size());
    put(&len, 8);
    put(t.name.data(), t.name.size());
    out += padded(len) - len;  // zeros
    put(&nd, 8);
    put(t.shape.data(), t.shape.size() * 8);
    put(t.data, size_t(numel(t.shape)) * sizeof(float));
  }
  return buf;
}

// Views of the records in buf (which must outlive them).
void unpack(const std::vector<char>& buf, std::vector<View>& out) {
  size_t off = 0;
  auto get = [&](void* p, size_t n) {
    TRIDENT_CHECK(off + n <= buf.size(), "checkpoint gather: truncated record");
    std::memcpy(p, buf.data() + off, n);
    off += n;
  };
  while (off < buf.size()) {
    View v;
    int64_t len = 0, nd = 0;
    get(&len, 8);
    TRIDENT_CHECK(len >= 0 && off + size_t(padded(len)) <= buf.size(),
                  "checkpoint gather: truncated record");
    v.name.assign(buf.data() + off, size_t(len));
    off += size_t(padded(len));
    get(&nd, 8);
    TRIDENT_CHECK(nd >= 0 && nd <= 32, "checkpoint gather: bad record");
    v.shape.resize(size_t(nd));
    get(v.shape.data(), size_t(nd) * 8);
    const size_t bytes = size_t(v.numel()) * sizeof(float);
    TRIDENT_CHECK(off + bytes <= buf.size(), "checkpoint gather: truncated record");
    v.data = reinterpret_cast<const float*>(buf.data() + off);
    off += bytes;
    out.push_back(std::move(v));
  }
}

void add_views(const std::vector<CheckpointTensor>& tensors, std::vector<View>& out) {
  for (const auto& t : tensors) out.push_back(View{t.name, t.shape, t.data});
}

// The first tensor holding a NaN or an infinity ("" if none): such a state
// is never written, so that the last checkpoint stays a good one.
std::string first_nonfinite(const std::vector<View>& all) {
  for (const View& v : all) {
    bool bad = false;
    const int64_t n = v.numel();
    for (int64_t i = 0; i < n; ++i) bad |= !std::isfinite(v.data[i]);
    if (bad) return v.name;
  }
  return "";
}

// The checkpoint as an HDF5 file image in memory (core driver): the bytes are
// then written with POSIX calls, whose errors name the system's reason.
std::vector<char> file_image(const CheckpointMeta& meta, std::vector<View>& all) {
  h5::Lock lock(h5::library_mutex());
  h5::QuietErrors quiet;
  h5::Handle fapl = TRIDENT_H5_PLIST(H5Pcreate(H5P_FILE_ACCESS), "file access list");
  // the image grows by the tensors' bytes and a margin for the metadata at
  // once, instead of a MiB at a time (each growth a copy of the whole image)
  size_t bytes = size_t(1) << 20;
  for (const View& v : all) bytes += size_t(v.numel()) * sizeof(float) + 4096;
  TRIDENT_H5(H5Pset_fapl_core(fapl, bytes, false), "in-memory file driver");
  h5::Handle file(TRIDENT_H5(H5Fcreate("checkpoint-image", H5F_ACC_TRUNC, H5P_DEFAULT, fapl),
                             "create checkpoint image"),
                  H5Fclose);
  write_checkpoint_attrs(file, meta, kSingleFormatVersion);
  h5::Handle g = h5::open_or_create_group(file, "tensors");
  std::sort(all.begin(), all.end(), [](const View& a, const View& b) { return a.name < b.name; });
  for (size_t i = 0; i < all.size(); ++i) {
    const View& u = all[i];
    TRIDENT_CHECK(i == 0 || all[i - 1].name != u.name,
                  "checkpoint: tensor " + u.name + " was given by two ranks");
    std::vector<hsize_t> dims(u.shape.begin(), u.shape.end());
    h5::Handle space = TRIDENT_H5_SPACE(H5Screate_simple(int(dims.size()), dims.data(), nullptr),
                                        "dataspace of " + u.name);
    // names hold '/' ("param/layers.0.wq"): let HDF5 make the intermediate groups
    h5::Handle lcpl = TRIDENT_H5_PLIST(H5Pcreate(H5P_LINK_CREATE), "link creation list");
    TRIDENT_H5(H5Pset_create_intermediate_group(lcpl, 1), "intermediate groups");
    h5::Handle d = TRIDENT_H5_DSET(
        H5Dcreate2(g, u.name.c_str(), H5T_IEEE_F32LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT),
        "create " + u.name);
    TRIDENT_H5(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, u.data),
               "write " + u.name);
    h5::write_attr(d, "fnv1a64",
                   std::to_string(fnv1a64(u.data, size_t(u.numel()) * sizeof(float))));
  }
  h5::write_attr(file, "tensor_count", int64_t(all.size()));
  TRIDENT_H5(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush checkpoint image");
  const ssize_t size = TRIDENT_H5(H5Fget_file_image(file, nullptr, 0), "checkpoint image size");
  std::vector<char> image(static_cast<size_t>(size));
  TRIDENT_H5(H5Fget_file_image(file, image.data(), image.size()), "checkpoint image");
  return image;
}

[[noreturn]] void system_error(const std::string& what, const std::string& path) {
  throw Error("cannot " + what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

// Writes bytes to path and makes them durable (fsync), so that the rename
// that follows never publishes a file whose data is still in flight.
void write_file_durably(const std::string& path, const std::vector<char>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) system_error("create", path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      errno = err;
      system_error("write", path);
    }
    done += size_t(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    system_error("sync", path);
  }
  if (::close(fd) != 0) system_error("close", path);
}

namespace {

// tmp -> path, then the directory entry made durable too.
void publish(const std::string& tmp, const std::string& path, const std::string& dir) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) system_error("rename " + tmp + " to", path);
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// What a failed write leaves to resume from, for its message: the newest
// complete checkpoint in dir (a failed write never touches it), or none.
std::string what_is_kept(const std::string& dir) {
  const std::vector<std::string> kept = checkpoints_newest_first(dir);
  if (kept.empty()) return " (no earlier checkpoint in " + dir + " to resume from)";
  return " (the previous checkpoint, " + kept.front() + ", is kept)";
}

// Rank 0's part: the gathered tensors into checkpoint_dir; "" or the error.
std::string write_on_root(const std::string& dir, const std::string& path,
                          const CheckpointMeta& meta, std::vector<View>& all) {
  const std::string bad = first_nonfinite(all);
  if (!bad.empty())
    return "checkpoint " + path + ": tensor " + bad + " holds a NaN or an infinity; not written" +
           what_is_kept(dir);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  try {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create directory " + dir + ": " + ec.message());
    write_file_durably(tmp, file_image(meta, all));
    publish(tmp, path, dir);
    return "";
  } catch (const std::exception& e) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    return "checkpoint " + path + ": " + e.what() + what_is_kept(dir);
  }
}

}  // namespace

void write_checkpoint_attrs(int64_t file, const CheckpointMeta& meta, int64_t format_version) {
  const hid_t f = hid_t(file);
  h5::write_attr(f, "format", "trident-checkpoint");
  h5::write_attr(f, "format_version", format_version);
  h5::write_attr(f, "step", meta.step);
  h5::write_attr(f, "optimizer_steps", meta.optimizer_steps);
  h5::write_attr(f, "model_hash", meta.model_hash);
  h5::write_attr(f, "config_toml", meta.config_toml);
  h5::write_attr(f, "world_size", meta.world_size);
  h5::write_attr(f, "created_utc", h5::utc_iso8601_now());
}

uint64_t fnv1a64(const void* p, size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ULL;
  return h;
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "ckpt_step_%08lld.h5", static_cast<long long>(step));
  return (std::filesystem::path(dir) / name).string();
}

namespace {

// Rank 0: the other ranks' records (of the gathered sizes) received, then
// every tensor written. Returns the error ("" when the file is complete).
std::string receive_and_write(const std::string& dir, const std::string& path, Communicator* world,
                              const CheckpointMeta& meta, const std::vector<CheckpointTensor>& mine,
                              const std::vector<int64_t>& sizes) {
  const int size = int(sizes.size());
  std::vector<std::vector<char>> parts(static_cast<size_t>(size));
  std::vector<Request> reqs;
  for (int r = 1; r < size; ++r) {
    parts[size_t(r)].resize(size_t(sizes[size_t(r)]));
    if (sizes[size_t(r)] > 0)
      reqs.push_back(world->irecv(parts[size_t(r)].data(), parts[size_t(r)].size(), r, 7301));
  }
  if (!reqs.empty()) world->wait_all(reqs);
  std::vector<View> all;
  add_views(mine, all);
  for (int r = 1; r < size; ++r) unpack(parts[size_t(r)], all);
  return write_on_root(dir, path, meta, all);
}

}  // namespace

std::string write_checkpoint(const std::string& dir, Communicator* world,
                             const CheckpointMeta& meta,
                             const std::vector<CheckpointTensor>& mine) {
  const int size = world ? world->size() : 1;
  const int rank = world ? world->rank() : 0;
  // rank 0 writes its own tensors where they lie; the others send records
  std::vector<char> buf;
  if (rank != 0) buf = pack(mine);
  std::vector<int64_t> sizes(size_t(size), 0);
  const int64_t my = int64_t(buf.size());
  if (world && size > 1) world->allgather(&my, sizes.data(), sizeof(int64_t));
  const std::string path = checkpoint_path(dir, meta.step);
  std::string error;
  if (rank == 0) {
    error = receive_and_write(dir, path, world, meta, mine, sizes);
  } else if (my > 0) {
    Request r = world->isend(buf.data(), buf.size(), 0, 7301);
    world->wait(r);
  }
  // everyone learns whether the file is complete before going on
  int failed = error.empty() ? 0 : 1;
  if (world && size > 1) world->allreduce_max(&failed, 1);
  // rank 0 knows why and says it; the others end with it
  if (failed)
    throw AgreedError(error.empty() ? "checkpoint " + path + ": not written" : error, rank == 0);
  return path;
}

void write_checkpoint_file(const std::string& path, const CheckpointMeta& meta,
                           const std::vector<CheckpointTensor>& tensors) {
  std::vector<View> all;
  add_views(tensors, all);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const std::string error = write_on_root(dir.empty() ? "." : dir, path, meta, all);
  if (!error.empty()) throw Error(error);
}

std::vector<std::string> checkpoints_newest_first(const std::string& dir) {
  std::error_code ec;
  std::vector<std::string> names;
  if (!std::filesystem::is_directory(dir, ec)) return names;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    // exactly ckpt_step_NNNNNNNN.h5: not a temporary file, not a shard
    const bool digits = n.size() == 21 && std::all_of(n.begin() + 10, n.begin() + 18, ::isdigit);
    if (digits && n.rfind("ckpt_step_", 0) == 0 && n.substr(18) == ".h5") names.push_back(n);
  }
  // fixed-width step numbers: the name order is the step order
  std::sort(names.rbegin(), names.rend());
  for (auto& n : names) n = (std::filesystem::path(dir) / n).string();
  return names;
}

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Opens a checkpoint or shard file for reading; InputError naming it.
hid_t open_readable(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(what + " '" + path + "' does not exist");
  if (H5Fis_hdf5(path.c_str()) <= 0)
    throw InputError(what + " '" + path + "' is not a readable HDF5 file (corrupted or truncated)");
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) throw InputError(what + " '" + path + "' cannot be opened: " + h5::error_text());
  return f;
}

// A shard's checksums: uint64 attributes (one, or one a block).
std::vector<uint64_t> read_u64s(hid_t obj, const char* name, const std::string& where) {
  const hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
  if (a < 0) throw InputError(where + " has no checksum (corrupted file)");
  h5::Handle ah(a, H5Aclose);
  h5::Handle space(H5Aget_space(a), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  std::vector<uint64_t> v(size_t(std::max<hssize_t>(n, 1)));
  if (n < 1 || H5Aread(a, H5T_NATIVE_UINT64, v.data()) < 0)
    throw InputError(where + ": its checksum cannot be read (corrupted file)");
  return v;
}

void read_meta(hid_t f, const std::string& path, CheckpointMeta& meta, int64_t& version) {
  if (h5::read_string_attr(f, "format") != "trident-checkpoint")
    throw InputError("'" + path + "' is not a trident checkpoint (format attribute)");
  version = h5::read_int_attr(f, "format_version");
  if (version != kSingleFormatVersion && version != kFormatVersion)
    throw InputError("checkpoint '" + path + "' has format_version " + std::to_string(version) +
                     ", this trident reads 2 and 3 (since 2 every weight is stored [out, in]; "
                     "version 1 stored the SwiGLU and router weights [in, out])");
  meta.step = h5::read_int_attr(f, "step");
  meta.optimizer_steps = h5::read_int_attr(f, "optimizer_steps");
  meta.model_hash = h5::read_string_attr(f, "model_hash");
  meta.config_toml = h5::read_string_attr(f, "config_toml");
  meta.world_size = h5::read_int_attr(f, "world_size");
  h5::read_int_attr(f, "tensor_count");  // written last: its absence means an unfinished file
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  h5::Lock lock(h5::library_mutex());
  h5::QuietErrors quiet;
  const hid_t f = open_readable(path, "checkpoint");
  file_ = f;
  try {
    read_meta(f, path, meta_, version_);
    if (version_ == 3) {
      shards_ = h5::read_string_list_attr(f, "shards");
      shard_files_.assign(shards_.size(), -1);
    }
  } catch (const InputError&) {
    H5Fclose(f);
    file_ = -1;
    throw;
  } catch (const std::exception& e) {
    H5Fclose(f);
    file_ = -1;
    throw InputError("checkpoint '" + path + "' is damaged: " + e.what());
  }
}

CheckpointReader::~CheckpointReader() {
  h5::Lock lock(h5::library_mutex());
  for (int64_t s : shard_files_)
    if (s >= 0) H5Fclose(hid_t(s));
  if (file_ >= 0) H5Fclose(hid_t(file_));
}

bool CheckpointReader::has(const std::string& name) const {
  h5::Lock lock(h5::library_mutex());
  h5::QuietErrors quiet;
  const std::string full = "tensors/" + name;
  // check each level: H5Lexists needs the intermediate groups to exist
  size_t pos = 0;
  while (true) {
    pos = full.find('/', pos + 1);
    const std::string part = full.substr(0, pos);
    if (H5Lexists(hid_t(file_), part.c_str(), H5P_DEFAULT) <= 0) return false;
    if (pos == std::string::npos) return true;
  }
}

void CheckpointReader::check_shape(const std::string& name, int64_t dset,
                                   const std::vector<int64_t>& shape) const {
  h5::Handle space(H5Dget_space(hid_t(dset)), H5Sclose);
  const int nd = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(size_t(std::max(nd, 0)));
  if (nd >= 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  const std::vector<int64_t> got(dims.begin(), dims.end());
  if (got != shape)
    throw InputError("checkpoint '" + path_ + "': tensor " + name + " has shape " +
                     shape_text(got) + ", the model needs " + shape_text(shape));
}

void CheckpointReader::read(const std::string& name, const std::vector<int64_t>& shape,
                            float* out) const {
  read_range(name, shape, 0, numel(shape), out);
}

// Format 2: the whole dataset, its checksum checked.
void CheckpointReader::read_single(const std::string& name, const std::vector<int64_t>& shape,
                                   float* out) const {
  const std::string where = "checkpoint '" + path_ + "': tensor " + name;
  hid_t d = H5Dopen2(hid_t(file_), ("tensors/" + name).c_str(), H5P_DEFAULT);
  if (d < 0) throw InputError(where + " cannot be opened: " + h5::error_text());
  h5::Handle dh(d, H5Dclose);
  check_shape(name, d, shape);
  if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    throw InputError(where + " cannot be read (corrupted file): " + h5::error_text());
  std::string want;
  try {
    want = h5::read_string_attr(d, "fnv1a64");
  } catch (const std::exception&) {
    throw InputError(where + " has no checksum (corrupted file)");
  }
  if (want != std::to_string(fnv1a64(out, size_t(numel(shape)) * sizeof(float))))
    throw InputError(where + " fails its checksum (corrupted file)");
}

int64_t CheckpointReader::shard(int64_t rank) const {
  TRIDENT_CHECK(rank >= 0 && size_t(rank) < shards_.size(),
                "checkpoint '" + path_ + "': a piece names shard " + std::to_string(rank));
  int64_t& f = shard_files_[size_t(rank)];
  if (f >= 0) return f;
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  const std::string p =
      (std::filesystem::path(dir.empty() ? "." : dir) / shards_[size_t(rank)]).string();
  f = open_readable(p, "checkpoint '" + path_ + "': shard file");
  // written last, once every checksum is in
  if (read_u64s(hid_t(f), "complete", "checkpoint '" + path_ + "': shard file '" + p + "'").at(0) !=
      1)
    throw InputError("checkpoint '" + path_ + "': shard file '" + p + "' is unfinished");
  return f;
}

namespace {

// Elements [from, from + n) of the dataset d into dst.
void read_slab(hid_t d, int64_t from, int64_t n, float* dst, const std::string& where) {
  hsize_t off[1] = {hsize_t(from)}, cnt[1] = {hsize_t(n)};
  h5::Handle fsel(H5Dget_space(d), H5Sclose);
  h5::Handle msel(H5Screate_simple(1, cnt, nullptr), H5Sclose);
  if (H5Sselect_hyperslab(fsel, H5S_SELECT_SET, off, nullptr, cnt, nullptr) < 0 ||
      H5Dread(d, H5T_NATIVE_FLOAT, msel, fsel, H5P_DEFAULT, dst) < 0)
    throw InputError(where + " cannot be read (truncated or corrupted file): " + h5::error_text());
}

// The `count` elements at dst, which start at checksum block b0, against
// their blocks' checksums.
void check_blocks(const std::vector<uint64_t>& blocks, int64_t b0, const float* dst, int64_t count,
                  const std::string& where) {
  for (int64_t at = 0, b = b0; at < count; at += kChecksumBlock, ++b) {
    const int64_t n = std::min(kChecksumBlock, count - at);
    if (size_t(b) >= blocks.size() ||
        blocks[size_t(b)] != fnv1a64(dst + at, size_t(n) * sizeof(float)))
      throw InputError(where + " fails its checksum (corrupted file)");
  }
}

}  // namespace

// Elements [lo, hi) of the piece [pb, pe) that `rank` wrote, into out: the
// whole piece checked against its checksum, a part against its blocks'.
void CheckpointReader::read_piece(const std::string& name, int64_t rank, int64_t pb, int64_t pe,
                                  int64_t lo, int64_t hi, float* out) const {
  const hid_t f = hid_t(shard(rank));
  const std::string where = "checkpoint '" + path_ + "': tensor " + name + " in shard file '" +
                            shards_[size_t(rank)] + "'";
  const hid_t d = H5Dopen2(f, ("tensors/" + name).c_str(), H5P_DEFAULT);
  if (d < 0) throw InputError(where + " is missing (corrupted file)");
  h5::Handle dh(d, H5Dclose);
  if (h5::read_int_attr(d, "begin") != pb || h5::read_int_attr(d, "end") != pe)
    throw InputError(where + " holds other elements than the index says");
  const std::vector<uint64_t> whole = read_u64s(d, "fnv1a64", where);
  const std::vector<uint64_t> blocks = read_u64s(d, "fnv1a64_blocks", where);
  const bool all = lo == pb && hi == pe;
  // a part: whole checksum blocks around it
  const int64_t b0 = all ? 0 : (lo - pb) / kChecksumBlock;
  const int64_t first = all ? pb : pb + b0 * kChecksumBlock;
  const int64_t last =
      all ? pe
          : std::min(pe, pb + ((hi - pb) + kChecksumBlock - 1) / kChecksumBlock * kChecksumBlock);
  std::vector<float> buf(all ? 0 : size_t(last - first));
  float* dst = all ? out : buf.data();
  read_slab(d, first - pb, last - first, dst, where);
  if (all) {
    if (whole.at(0) != fnv1a64(dst, size_t(pe - pb) * sizeof(float)))
      throw InputError(where + " fails its checksum (corrupted file)");
    return;
  }
  check_blocks(blocks, b0, dst, last - first, where);
  std::copy(dst + (lo - first), dst + (hi - first), out);
}

// The index's piece table of tensor `name` (rank, begin, end per piece),
// after the checks every read makes (present, of this shape).
std::vector<int64_t> CheckpointReader::piece_table(const std::string& name,
                                                   const std::vector<int64_t>& shape, int64_t begin,
                                                   int64_t end) const {
  const std::string where = "checkpoint '" + path_ + "': tensor " + name;
  if (!has(name)) throw InputError(where + " is missing (a checkpoint of another model?)");
  TRIDENT_CHECK(0 <= begin && begin <= end && end <= numel(shape), where + ": bad range");
  const hid_t d = H5Dopen2(hid_t(file_), ("tensors/" + name).c_str(), H5P_DEFAULT);
  if (d < 0) throw InputError(where + " cannot be opened: " + h5::error_text());
  h5::Handle dh(d, H5Dclose);
  check_shape(name, d, shape);
  try {
    return h5::read_int_list_attr(d, "pieces");
  } catch (const std::exception&) {
    throw InputError(where + " has no piece table (corrupted index)");
  }
}

void CheckpointReader::read_range(const std::string& name, const std::vector<int64_t>& shape,
                                  int64_t begin, int64_t end, float* out) const {
  h5::Lock lock(h5::library_mutex());
  h5::QuietErrors quiet;
  const std::string where = "checkpoint '" + path_ + "': tensor " + name;
  if (version_ == 2) {
    if (!has(name)) throw InputError(where + " is missing (a checkpoint of another model?)");
    TRIDENT_CHECK(0 <= begin && begin <= end && end <= numel(shape), where + ": bad range");
    if (begin == 0 && end == numel(shape)) return read_single(name, shape, out);
    std::vector<float> all(size_t(numel(shape)));
    read_single(name, shape, all.data());
    std::copy(all.begin() + begin, all.begin() + end, out);
    return;
  }
  const std::vector<int64_t> pieces = piece_table(name, shape, begin, end);
  int64_t covered = 0;
  for (size_t i = 0; i + 2 < pieces.size(); i += 3) {
    const int64_t lo = std::max(begin, pieces[i + 1]), hi = std::min(end, pieces[i + 2]);
    if (lo >= hi) continue;
    read_piece(name, pieces[i], pieces[i + 1], pieces[i + 2], lo, hi, out + (lo - begin));
    covered += hi - lo;
  }
  if (covered != end - begin) throw InputError(where + ": the index's pieces do not cover it");
}

std::vector<std::string> CheckpointReader::shards_of(const std::string& name,
                                                     const std::vector<int64_t>& shape,
                                                     int64_t begin, int64_t end) const {
  h5::Lock lock(h5::library_mutex());
  h5::QuietErrors quiet;
  if (version_ == 2) return {};
  const std::vector<int64_t> pieces = piece_table(name, shape, begin, end);
  std::vector<std::string> out;
  for (size_t i = 0; i + 2 < pieces.size(); i += 3) {
    if (std::max(begin, pieces[i + 1]) >= std::min(end, pieces[i + 2])) continue;
    TRIDENT_CHECK(pieces[i] >= 0 && size_t(pieces[i]) < shards_.size(),
                  "checkpoint '" + path_ + "': a piece names shard " + std::to_string(pieces[i]));
    out.push_back(shards_[size_t(pieces[i])]);
  }
  return out;
}

}  // namespace trident
