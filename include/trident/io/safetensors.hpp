// Safetensors files: reading by memory map, writing, and sharded sets with
// model.safetensors.index.json (the format Hugging Face models are stored in).
//
// A file is: 8 bytes, the header length N (unsigned little-endian); N bytes
// of JSON, an object mapping each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets into the data that follows the
// header) plus an optional "__metadata__" object of strings; then the raw
// little-endian tensor data, row-major.
//
// Reading is strict: a file that is shorter than 8 bytes, whose header runs
// past its end, whose header is not that JSON, whose tensors' bytes lie past
// the end, overlap, are not aligned to their element size, or do not match
// their dtype and shape, or that holds a dtype other than F32, BF16 and F16,
// is refused with an InputError of one line naming the file, the tensor and
// the rule (exit 2 at the CLI).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trident::safetensors {

enum class DType { f32, bf16, f16 };
const char* dtype_name(DType d);  // "F32", "BF16", "F16"
int dtype_size(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
  int64_t numel() const;
};

// One file, memory-mapped read-only for as long as the object lives.
class File {
 public:
  explicit File(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in header order
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's raw bytes (little-endian, its dtype).
  const unsigned char* bytes(const TensorInfo& t) const;
  // The tensor's values widened to float32 (exact for all three dtypes).
  std::vector<float> read_f32(const TensorInfo& t) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  const unsigned char* data_ = nullptr;  // start of the data section
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: name, dtype and shape; data is numel * dtype_size bytes.
struct OutTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;
};

// Writes one file (under a temporary name, renamed when complete). Tensors
// are laid out in the order given, each aligned to 8 bytes from the data
// section's start by the header's padding (spaces).
void write_file(const std::string& path, const std::vector<const OutTensor*>& tensors,
                const std::map<std::string, std::string>& metadata);

// Writes `tensors` into dir as model.safetensors, or, when their total
// exceeds max_shard_bytes (> 0), as model-0000i-of-0000n.safetensors shards
// (a tensor is never split; a shard closes before the tensor that would
// overflow it) with model.safetensors.index.json. Returns the files written.
std::vector<std::string> write_model(const std::string& dir, const std::vector<OutTensor>& tensors,
                                     uint64_t max_shard_bytes,
                                     const std::map<std::string, std::string>& metadata);

// The tensors of a model directory: model.safetensors, or the shards that
// model.safetensors.index.json names. Every file is opened (and checked);
// a name in two files, or an index entry whose file lacks it, is refused.
class ModelFiles {
 public:
  explicit ModelFiles(const std::string& dir);
  const std::string& dir() const { return dir_; }
  // The tensor named, with the file holding it; null if absent.
  const TensorInfo* find(const std::string& name, const File** file = nullptr) const;
  std::vector<std::string> names() const;  // every tensor, sorted
  // Values as float32 after checking the shape; InputError naming the
  // tensor when it is missing or of another shape.
  std::vector<float> read(const std::string& name, const std::vector<int64_t>& shape,
                          const std::string& shape_source) const;
  // The dtype of the model's tensors when all share one, else f32.
  DType common_dtype() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<File>> files_;
  std::map<std::string, std::pair<const File*, const TensorInfo*>> index_;
};

// bf16 <-> f32 and f16 <-> f32 (round to nearest even; NaN kept quiet; f16
// overflow to infinity, underflow through its subnormals to zero).
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

}  // namespace trident::safetensors
