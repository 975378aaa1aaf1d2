// Safetensors reading (memory map), writing and sharded model directories
// (io/safetensors.hpp).
#include "trident/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "trident/core/error.hpp"
#include "trident/io/json.hpp"

namespace trident::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as is");

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
  }
  return "?";
}

int dtype_size(DType d) { return d == DType::f32 ? 4 : 2; }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu))
    return uint16_t((u >> 16) | 0x0040u);  // NaN stays a (quiet) NaN
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a >= 0x7F800000u) return uint16_t(sign | (a > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds past 65504: infinity
  if (a >= 0x38800000u) {                                 // a normal half: rebias, round at bit 13
    const uint32_t r = a + 0x0FFFu + ((a >> 13) & 1u);
    return uint16_t(sign | ((r - 0x38000000u) >> 13));
  }
  if (a <= 0x33000000u) return sign;  // at most 2^-25: rounds (ties to even) to zero
  // A subnormal half: the significand in units of 2^-24, rounded to nearest even.
  const uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126u - (a >> 23);
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu, u;
  if (exp == 0x1F) {
    u = sign | 0x7F800000u | (man << 13);  // inf or NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;  // +-0
  } else {     // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while (!(man & 0x400u));
    u = sign | (uint32_t(112 - e) << 23) | ((man & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

namespace {

std::string range_text(uint64_t b, uint64_t e) {
  return "[" + std::to_string(b) + ", " + std::to_string(e) + ")";
}

DType parse_dtype(const std::string& d, const std::string& what) {
  if (d == "F32") return DType::f32;
  if (d == "BF16") return DType::bf16;
  if (d == "F16") return DType::f16;
  throw InputError(what + ": dtype \"" + d + "\" is not supported (F32, BF16, F16)");
}

// The extents into shape; returns their product, refused past 2^62.
uint64_t parse_shape(const json::Value& v, const std::string& what, std::vector<int64_t>& shape) {
  uint64_t numel = 1;
  for (const json::Value& s : v.items(what + ": shape")) {
    const int64_t e = s.as_int(what + ": shape");
    if (e < 0 || (e > 0 && numel > (uint64_t(1) << 62) / uint64_t(e)))
      throw InputError(what + ": shape has a negative or too large extent");
    shape.push_back(e);
    numel *= uint64_t(e);
  }
  return numel;
}

// One header entry: its dtype, shape and data_offsets, checked against
// each other and against the data section's size.
TensorInfo parse_entry(const std::string& path, const std::string& name, const json::Value& v,
                       uint64_t data_size) {
  const std::string what = path + ": tensor '" + name + "'";
  TensorInfo t;
  t.name = name;
  const json::Value *dt = nullptr, *shape = nullptr, *off = nullptr;
  for (const auto& [k, f] : v.members(what)) {
    if (k == "dtype")
      dt = &f;
    else if (k == "shape")
      shape = &f;
    else if (k == "data_offsets")
      off = &f;
    else
      throw InputError(what + ": unknown field \"" + k + "\"");
  }
  if (!dt || !shape || !off)
    throw InputError(what + ": needs \"dtype\", \"shape\" and \"data_offsets\"");
  const std::string& d = dt->as_string(what + ": dtype");
  t.dtype = parse_dtype(d, what);
  const uint64_t numel = parse_shape(*shape, what, t.shape);
  const auto& o = off->items(what + ": data_offsets");
  if (o.size() != 2) throw InputError(what + ": data_offsets must be [begin, end]");
  const int64_t b = o[0].as_int(what + ": data_offsets"), e = o[1].as_int(what + ": data_offsets");
  if (b < 0 || e < b)
    throw InputError(what + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                     "] are not 0 <= begin <= end");
  t.begin = uint64_t(b);
  t.end = uint64_t(e);
  const uint64_t need = numel * uint64_t(dtype_size(t.dtype));
  if (t.end - t.begin != need)
    throw InputError(what + ": data_offsets " + range_text(t.begin, t.end) + " hold " +
                     std::to_string(t.end - t.begin) + " bytes; " + d + " of its shape needs " +
                     std::to_string(need));
  if (t.end > data_size)
    throw InputError(path + ": truncated file: tensor '" + name + "' ends at data byte " +
                     std::to_string(t.end) + ", the data holds " + std::to_string(data_size));
  if (t.begin % uint64_t(dtype_size(t.dtype)) != 0)
    throw InputError(what + ": offset " + std::to_string(t.begin) +
                     " is not aligned to its element size " + std::to_string(dtype_size(t.dtype)));
  return t;
}

// No two tensors share a byte.
void check_overlaps(const std::string& path, const std::vector<TensorInfo>& tensors_) {
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_)
    if (t.end > t.begin) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      throw InputError(path + ": tensors '" + by_offset[i - 1]->name + "' " +
                       range_text(by_offset[i - 1]->begin, by_offset[i - 1]->end) + " and '" +
                       by_offset[i]->name + "' " +
                       range_text(by_offset[i]->begin, by_offset[i]->end) + " overlap");
}

}  // namespace

File::File(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(path + ": not a regular file");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      ::close(fd);
      throw InputError(path + ": cannot map: " + std::strerror(errno));
    }
  }
  ::close(fd);
  try {
    const auto* base = static_cast<const unsigned char*>(map_);
    if (size_ < 8)
      throw InputError(path + ": truncated file: " + std::to_string(size_) +
                       " bytes, fewer than the 8-byte header length");
    uint64_t n = 0;
    std::memcpy(&n, base, 8);
    if (n > size_ - 8)
      throw InputError(path + ": header length " + std::to_string(n) +
                       " runs past the end of the file (" + std::to_string(size_) + " bytes)");
    const std::string_view header(reinterpret_cast<const char*>(base + 8), size_t(n));
    data_ = base + 8 + n;
    const uint64_t data_size = size_ - 8 - n;
    const json::Value h = json::parse(header, path + ": header");
    for (const auto& [name, v] : h.members(path + ": header")) {
      if (name == "__metadata__") {
        for (const auto& [k, s] : v.members(path + ": __metadata__"))
          metadata_[k] = s.as_string(path + ": __metadata__." + k);
        continue;
      }
      tensors_.push_back(parse_entry(path, name, v, data_size));
    }
    check_overlaps(path, tensors_);
  } catch (...) {
    if (map_) ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

File::~File() {
  if (map_) ::munmap(map_, size_);
}

const TensorInfo* File::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const unsigned char* File::bytes(const TensorInfo& t) const { return data_ + t.begin; }

std::vector<float> File::read_f32(const TensorInfo& t) const {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  const unsigned char* p = bytes(t);
  if (t.dtype == DType::f32) {
    if (n) std::memcpy(out.data(), p, size_t(n) * 4);
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    out[size_t(i)] = t.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
  }
  return out;
}

void write_file(const std::string& path, const std::vector<const OutTensor*>& tensors,
                const std::map<std::string, std::string>& metadata) {
  // Data laid out widest element first, so every tensor starts at a multiple
  // of its element size without gaps (readers refuse gaps).
  std::vector<const OutTensor*> order = tensors;
  std::stable_sort(order.begin(), order.end(), [](const OutTensor* a, const OutTensor* b) {
    return dtype_size(a->dtype) > dtype_size(b->dtype);
  });
  json::Value h = json::Value::object();
  if (!metadata.empty()) {
    json::Value m = json::Value::object();
    for (const auto& [k, v] : metadata) m.set(k, json::Value::string(v));
    h.set("__metadata__", std::move(m));
  }
  uint64_t off = 0;
  for (const OutTensor* t : order) {
    int64_t numel = 1;
    for (int64_t s : t->shape) numel *= s;
    TRIDENT_CHECK(uint64_t(numel) * uint64_t(dtype_size(t->dtype)) == t->data.size(),
                  "safetensors: tensor " + t->name + " has the wrong number of bytes");
    json::Value e = json::Value::object();
    e.set("dtype", json::Value::string(dtype_name(t->dtype)));
    json::Value shape = json::Value::array();
    for (int64_t s : t->shape) shape.push(json::Value::integer(s));
    e.set("shape", std::move(shape));
    json::Value o = json::Value::array();
    o.push(json::Value::integer(int64_t(off)));
    o.push(json::Value::integer(int64_t(off + t->data.size())));
    e.set("data_offsets", std::move(o));
    TRIDENT_CHECK(!h.find(t->name), "safetensors: tensor " + t->name + " given twice");
    h.set(t->name, std::move(e));
    off += t->data.size();
  }
  std::string header = h.dump();
  while (header.size() % 8 != 0) header += ' ';
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw InputError(path + ": cannot write: " + std::strerror(errno));
    const uint64_t n = header.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.write(header.data(), std::streamsize(header.size()));
    for (const OutTensor* t : order)
      f.write(reinterpret_cast<const char*>(t->data.data()), std::streamsize(t->data.size()));
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      throw Error(path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(path + ": cannot rename the finished file into place");
  }
}

std::vector<std::string> write_model(const std::string& dir, const std::vector<OutTensor>& tensors,
                                     uint64_t max_shard_bytes,
                                     const std::map<std::string, std::string>& metadata) {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.data.size();
  std::vector<std::vector<const OutTensor*>> shards(1);
  uint64_t in_shard = 0;
  for (const auto& t : tensors) {
    if (max_shard_bytes > 0 && !shards.back().empty() &&
        in_shard + t.data.size() > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&t);
    in_shard += t.data.size();
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    const std::string name = "model.safetensors";
    write_file(dir + "/" + name, shards[0], metadata);
    return {name};
  }
  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_file(dir + "/" + buf, shards[i], metadata);
    for (const OutTensor* t : shards[i]) weight_map[t->name] = buf;
    written.push_back(buf);
  }
  json::Value idx = json::Value::object();
  json::Value meta = json::Value::object();
  meta.set("total_size", json::Value::integer(int64_t(total)));
  idx.set("metadata", std::move(meta));
  json::Value wm = json::Value::object();
  for (const auto& [k, v] : weight_map) wm.set(k, json::Value::string(v));
  idx.set("weight_map", std::move(wm));
  const std::string path = dir + "/model.safetensors.index.json";
  {
    std::ofstream f(path + ".tmp", std::ios::trunc);
    f << idx.dump() << "\n";
    if (!f) throw Error(path + ": write failed");
  }
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0)
    throw Error(path + ": cannot rename the finished file into place");
  written.push_back("model.safetensors.index.json");
  return written;
}

namespace {

// model.safetensors.index.json: each tensor's file (wanted), and the files
// in the order first named.
void read_index(const std::string& index_path,
                std::vector<std::pair<std::string, std::string>>& wanted,
                std::vector<std::string>& files) {
  std::ifstream f(index_path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const json::Value idx = json::parse(text, index_path);
  const json::Value* wm = idx.find("weight_map");
  if (!wm) throw InputError(index_path + ": no \"weight_map\"");
  std::set<std::string> seen;
  for (const auto& [name, file] : wm->members(index_path + ": weight_map")) {
    const std::string& fname = file.as_string(index_path + ": weight_map." + name);
    if (fname.empty() || fname.find('/') != std::string::npos || fname == "." || fname == "..")
      throw InputError(index_path + ": weight_map." + name + ": \"" + fname +
                       "\" is not a file name in the model directory");
    wanted.emplace_back(name, fname);
    if (seen.insert(fname).second) files.push_back(fname);
  }
}

}  // namespace

ModelFiles::ModelFiles(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::pair<std::string, std::string>> wanted;  // tensor -> file (index)
  std::vector<std::string> files;
  if (fs::exists(index_path)) {
    read_index(index_path, wanted, files);
  } else if (fs::exists(dir + "/model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    throw InputError(dir + ": neither model.safetensors nor model.safetensors.index.json");
  }
  for (const std::string& name : files) {
    files_.push_back(std::make_unique<File>(dir + "/" + name));
    const File* file = files_.back().get();
    for (const auto& t : file->tensors()) {
      auto [it, fresh] = index_.emplace(t.name, std::make_pair(file, &t));
      if (!fresh)
        throw InputError(dir + ": tensor '" + t.name + "' is in both " + it->second.first->path() +
                         " and " + file->path());
    }
  }
  for (const auto& [name, fname] : wanted) {
    auto it = index_.find(name);
    if (it == index_.end() || it->second.first->path() != dir + "/" + fname)
      throw InputError(index_path + ": missing tensor '" + name + "': not in " + fname);
  }
}

const TensorInfo* ModelFiles::find(const std::string& name, const File** file) const {
  auto it = index_.find(name);
  if (it == index_.end()) return nullptr;
  if (file) *file = it->second.first;
  return it->second.second;
}

std::vector<std::string> ModelFiles::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : index_) out.push_back(k);
  return out;
}

std::vector<float> ModelFiles::read(const std::string& name, const std::vector<int64_t>& shape,
                                    const std::string& shape_source) const {
  const File* file = nullptr;
  const TensorInfo* t = find(name, &file);
  if (!t) throw InputError(dir_ + ": missing tensor '" + name + "'");
  if (t->shape != shape) {
    auto text = [](const std::vector<int64_t>& s) {
      std::string o = "[";
      for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
      return o + "]";
    };
    throw InputError(file->path() + ": tensor '" + name + "' has shape " + text(t->shape) + ", " +
                     shape_source + " says " + text(shape));
  }
  return file->read_f32(*t);
}

DType ModelFiles::common_dtype() const {
  std::set<DType> seen;
  for (const auto& [k, v] : index_) seen.insert(v.second->dtype);
  return seen.size() == 1 ? *seen.begin() : DType::f32;
}

}  // namespace trident::safetensors
