// `trident convert hf DIR --out CKPT.h5 [--config-out MODEL.toml]` and
// `trident convert to-hf CKPT.h5 --out DIR [--dtype fp32|bf16|fp16] [--shard-size BYTES]`:
// Hugging Face models in and out (io/hf_model.hpp, share/trident/models.md).
// One process, no MPI: a checkpoint is mesh-independent, so the converted
// one starts or resumes a run on any mesh.
#include "commands.hpp"
#include "trident/core/error.hpp"
#include "trident/io/hf_model.hpp"

namespace trident::cli {
namespace {

class ConvertFromHf : public Command {
 public:
  explicit ConvertFromHf(CLI::App* app) {
    app->add_option("dir", dir_, "Hugging Face model directory (config.json, safetensors)")
        ->required();
    app->add_option("--out", out_, "Checkpoint to write (HDF5)")->required();
    app->add_option("--config-out", config_out_,
                    "Also write a trident config (TOML) whose [model] is the converted model");
  }
  bool needs_mpi() const override { return false; }
  int run() override {
    hf::convert_from_hf(dir_, out_, config_out_);
    return 0;
  }

 private:
  std::string dir_, out_, config_out_;
};

class ConvertToHf : public Command {
 public:
  explicit ConvertToHf(CLI::App* app) {
    app->add_option("checkpoint", ckpt_, "trident checkpoint (HDF5)")->required();
    app->add_option("--out", out_, "Hugging Face model directory to write")->required();
    app->add_option("--dtype", dtype_,
                    "Tensor type of the safetensors: fp32 (default), bf16 or fp16")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    app->add_option("--shard-size", shard_,
                    "Largest safetensors file in bytes before the model is sharded "
                    "(model.safetensors.index.json); default 5000000000")
        ->check(CLI::PositiveNumber);
  }
  bool needs_mpi() const override { return false; }
  int run() override {
    const safetensors::DType dtype = dtype_ == "bf16"   ? safetensors::DType::bf16
                                     : dtype_ == "fp16" ? safetensors::DType::f16
                                                        : safetensors::DType::f32;
    hf::convert_to_hf(ckpt_, out_, dtype, shard_);
    return 0;
  }

 private:
  std::string ckpt_, out_, dtype_ = "fp32";
  uint64_t shard_ = 5000000000ULL;
};

}  // namespace

std::unique_ptr<Command> add_convert_hf(CLI::App& convert) {
  return std::make_unique<ConvertFromHf>(
      convert.add_subcommand("hf", "Hugging Face model directory -> trident checkpoint"));
}

std::unique_ptr<Command> add_convert_to_hf(CLI::App& convert) {
  return std::make_unique<ConvertToHf>(
      convert.add_subcommand("to-hf", "trident checkpoint -> Hugging Face model directory"));
}

}  // namespace trident::cli
