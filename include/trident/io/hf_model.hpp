// Hugging Face causal language models <-> trident checkpoints: the
// architectures trident computes exactly (LlamaForCausalLM,
// MixtralForCausalLM, Qwen3MoeForCausalLM), their config.json fields and
// their tensor names. share/trident/models.md is the user's description of
// the mapping and of what is refused.
//
// Both sides store a linear layer's weight [out, in] and rotate q and k by
// halves (pairs (i, i + head_dim / 2)), so every tensor maps one to one,
// without a transpose or a permutation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "trident/core/config.hpp"
#include "trident/io/json.hpp"
#include "trident/io/safetensors.hpp"

namespace trident::hf {

enum class Arch { llama, mixtral, qwen3_moe };
const char* arch_name(Arch a);   // "LlamaForCausalLM", ...
const char* model_type(Arch a);  // "llama", "mixtral", "qwen3_moe"

struct HfConfig {
  Arch arch = Arch::llama;
  ModelConfig model;                    // trident's [model] keys
  int64_t max_position_embeddings = 0;  // recorded, not used by the model
  std::string dtype;                    // torch_dtype / dtype, if given
};

// Reads config.json (path names it in errors). A field trident cannot
// honour (another architecture, biases, per-layer sliding windows, dropout, another
// RoPE type, an unknown field) is an InputError naming it.
HfConfig read_config(const std::string& path);

// config.json of a trident model in architecture a (max_positions: its
// max_position_embeddings).
json::Value make_config(Arch a, const ModelConfig& m, safetensors::DType dtype,
                        int64_t max_positions);

// The architecture a trident model is an instance of; InputError naming the
// [model] key that no supported architecture has.
Arch arch_of(const ModelConfig& m, const std::string& source);

// One parameter: its trident name, its Hugging Face name, its shape (the
// same on both sides).
struct TensorName {
  std::string trident, hf;
  std::vector<int64_t> shape;
};
std::vector<TensorName> tensor_names(Arch a, const ModelConfig& m);

// trident convert hf: DIR -> checkpoint (step 0, zero AdamW moments) and,
// when config_out is not empty, the resolved config TOML with its [model].
void convert_from_hf(const std::string& dir, const std::string& out_ckpt,
                     const std::string& config_out);

// trident convert to-hf: checkpoint -> DIR (config.json and safetensors,
// sharded above max_shard_bytes).
void convert_to_hf(const std::string& ckpt, const std::string& out_dir, safetensors::DType dtype,
                   uint64_t max_shard_bytes);

}  // namespace trident::hf
