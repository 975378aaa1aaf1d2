// Config: every key of DESIGN.md's [model] [data] [parallel] [train]
// [runtime] [output] [topology] tables, typed, with its default.
//
// load_config() reads TOML (TOML++), applies `--set section.key=value`
// overrides, and rejects unknown keys (suggesting the nearest known one),
// wrong types and out-of-range values. validate() adds the rules that relate
// keys to each other and to the world size. Every error is an InputError with
// one line: "FILE:LINE: key: rule" (or "--set key=value: rule").
// share/trident/config-reference.md documents every key.
//
// Keys with a fixed set of values are enums here, parsed once; config_name()
// gives back the TOML spelling. The rules of the parallel layers (cp, pp, ep)
// live in those layers and report through config_rule_failed(); train's
// check_config() runs every layer's rules.
//
// load_config() also runs validate_config(cfg, 0) (core's rules that do not
// need the world size); parse_config_text() only parses, so that tests and
// checkpoints can hold a config that a particular world would reject.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trident {

// Values of the enum-valued keys, in the order of their TOML spellings
// (config_names<E>()).
enum class RouterScoring { softmax, sigmoid_bias };  // model.router
enum class RopeScaling { none, linear, llama3 };     // model.rope_scaling
enum class DataTask { recall, copy, tokens };        // data.task
enum class TokenDType { uint16, uint32 };            // data.token_dtype
enum class DataFormat { flat, megatron };            // data.format
enum class Packing { none, documents };              // data.packing
enum class CpLayout { contiguous, zigzag, docs };    // parallel.cp_layout
enum class CpMode { ring, ulysses, hybrid };         // parallel.cp_mode
enum class PipelineSchedule {
  afab,
  one_f_one_b,
  interleaved,
  zb_h1,
  zb_v,
  dualpipev
};                                                           // parallel.schedule
enum class Backend { cpu, cuda, automatic, emulated };       // runtime.backend
enum class CommBackend { mpi, nccl, automatic };             // runtime.comm
enum class EpTransportChoice { alltoallv, shm, automatic };  // runtime.ep_transport
enum class NonFinitePolicy { stop, skip };                   // train.on_nonfinite
enum class Precision { fp32, bf16 };                         // train.precision
enum class Recompute { none, selective, full };              // train.recompute
enum class OptimizerSharding { none, dp };                   // train.optimizer_sharding
enum class CheckpointFormat { sharded, single };             // output.checkpoint_format

template <typename E>
struct ConfigNames;  // ::names: the TOML spelling of each value, in the enum's order
template <>
struct ConfigNames<RouterScoring> {
  static constexpr std::array<std::string_view, 2> names = {"softmax", "sigmoid_bias"};
};
template <>
struct ConfigNames<RopeScaling> {
  static constexpr std::array<std::string_view, 3> names = {"none", "linear", "llama3"};
};
template <>
struct ConfigNames<DataTask> {
  static constexpr std::array<std::string_view, 3> names = {"recall", "copy", "tokens"};
};
template <>
struct ConfigNames<TokenDType> {
  static constexpr std::array<std::string_view, 2> names = {"uint16", "uint32"};
};
template <>
struct ConfigNames<DataFormat> {
  static constexpr std::array<std::string_view, 2> names = {"flat", "megatron"};
};
template <>
struct ConfigNames<Packing> {
  static constexpr std::array<std::string_view, 2> names = {"none", "documents"};
};
template <>
struct ConfigNames<CpLayout> {
  static constexpr std::array<std::string_view, 3> names = {"contiguous", "zigzag", "docs"};
};
template <>
struct ConfigNames<CpMode> {
  static constexpr std::array<std::string_view, 3> names = {"ring", "ulysses", "hybrid"};
};
template <>
struct ConfigNames<PipelineSchedule> {
  static constexpr std::array<std::string_view, 6> names = {"afab",  "1f1b", "interleaved",
                                                            "zb-h1", "zb-v", "dualpipev"};
};
template <>
struct ConfigNames<Backend> {
  static constexpr std::array<std::string_view, 4> names = {"cpu", "cuda", "auto", "emulated"};
};
template <>
struct ConfigNames<CommBackend> {
  static constexpr std::array<std::string_view, 3> names = {"mpi", "nccl", "auto"};
};
template <>
struct ConfigNames<EpTransportChoice> {
  static constexpr std::array<std::string_view, 3> names = {"alltoallv", "shm", "auto"};
};
template <>
struct ConfigNames<NonFinitePolicy> {
  static constexpr std::array<std::string_view, 2> names = {"stop", "skip"};
};
template <>
struct ConfigNames<Recompute> {
  static constexpr std::array<std::string_view, 3> names = {"none", "selective", "full"};
};
template <>
struct ConfigNames<Precision> {
  static constexpr std::array<std::string_view, 2> names = {"fp32", "bf16"};
};
template <>
struct ConfigNames<OptimizerSharding> {
  static constexpr std::array<std::string_view, 2> names = {"none", "dp"};
};
template <>
struct ConfigNames<CheckpointFormat> {
  static constexpr std::array<std::string_view, 2> names = {"sharded", "single"};
};

// The TOML spelling of v ("1f1b" for PipelineSchedule::one_f_one_b).
template <typename E>
std::string config_name(E v) {
  return std::string(ConfigNames<E>::names[static_cast<size_t>(v)]);
}
// The value spelt `name`, or nullopt.
template <typename E>
std::optional<E> parse_config_name(std::string_view name) {
  const auto& n = ConfigNames<E>::names;
  for (size_t i = 0; i < n.size(); ++i)
    if (n[i] == name) return static_cast<E>(i);
  return std::nullopt;
}

struct ModelConfig {
  int vocab_size = 64;
  int d_model = 64;
  int n_layers = 4;
  int n_heads = 4;
  int n_kv_heads = 4;  // < n_heads: grouped-query attention
  int ffn_hidden = 128;
  int n_experts = 8;  // 0: dense FFN
  int top_k = 2;
  int moe_every = 1;  // every k-th layer is an MoE layer
  RouterScoring router = RouterScoring::softmax;
  double capacity_factor = 0.0;  // 0: dropless
  double aux_loss_coef = 0.01;
  double rope_theta = 10000.0;
  // additions (keys may be added):
  bool norm_topk = true;           // renormalise the chosen k weights to sum 1
  double z_loss_coef = 0.0;        // router z-loss coefficient (0: off)
  double router_bias_rate = 1e-3;  // sigmoid_bias: bias update rate per step
  double init_std = 0.02;
  int window = 0;  // sliding-window attention: a token sees the last `window` positions; 0: off
  // Pre-trained architectures (share/trident/models.md); each default keeps
  // the model as it was before these keys existed.
  int head_dim_key = 0;           // model.head_dim; 0: d_model / n_heads
  int moe_ffn_hidden = 0;         // hidden size of each expert; 0: ffn_hidden
  std::vector<int> dense_layers;  // layers that stay dense whatever moe_every says
  bool tie_embeddings = false;    // the LM head is the embedding table
  bool qk_norm = false;           // RMSNorm over each head of q and k before RoPE
  double norm_eps = 1e-5;         // every RMSNorm's epsilon
  RopeScaling rope_scaling = RopeScaling::none;
  double rope_factor = 1.0;                // linear, llama3: the context extension factor
  double rope_low_freq_factor = 1.0;       // llama3
  double rope_high_freq_factor = 4.0;      // llama3
  int rope_original_max_positions = 8192;  // llama3: the context trained before scaling

  int head_dim() const { return head_dim_key > 0 ? head_dim_key : d_model / n_heads; }
  int expert_ffn_hidden() const { return moe_ffn_hidden > 0 ? moe_ffn_hidden : ffn_hidden; }
  bool is_moe_layer(int layer) const {
    if (n_experts <= 0 || (layer % moe_every) != (moe_every - 1)) return false;
    for (int l : dense_layers)
      if (l == layer) return false;
    return true;
  }

  bool operator==(const ModelConfig&) const = default;
};

struct DataConfig {
  DataTask task = DataTask::recall;
  int seq_len = 256;
  int micro_batch_size = 2;
  int num_microbatches = 4;
  uint64_t seed = 1234;
  std::string token_file;  // task = "tokens": flat binary token ids
  TokenDType token_dtype = TokenDType::uint16;
  // task = "tokens" (model/data.hpp, share/trident/data.md):
  DataFormat format = DataFormat::flat;  // flat: token_file; megatron: prefix (.bin + .idx)
  std::string prefix;                    // Megatron indexed dataset, without .bin/.idx
  int eod_token = -1;                    // flat files: a document ends with this id (-1: none)
  struct BlendEntry {
    double weight = 1.0;
    std::string path;  // a token file (format flat) or a prefix (format megatron)
    bool operator==(const BlendEntry&) const = default;
  };
  std::vector<BlendEntry> blend;  // non-empty: replaces token_file / prefix
  std::string split = "100,0";    // train,validation[,test] shares of each dataset's documents
  Packing packing = Packing::none;
  bool reset_positions = true;  // packing: RoPE positions restart at each document

  bool operator==(const DataConfig&) const = default;
};

// [eval]: validation loss every `every` steps (0: never) over `steps`
// global batches of validation data: the validation share of data.split, or
// a file of its own (eval.token_file / eval.prefix, read whole).
struct EvalConfig {
  int every = 0;
  int steps = 1;
  std::string token_file;  // data.format = "flat"
  std::string prefix;      // data.format = "megatron"

  bool uses_split() const { return token_file.empty() && prefix.empty(); }
  bool operator==(const EvalConfig&) const = default;
};

// data.split as shares (train, validation, test), each >= 0; InputError
// naming data.split when it is not 2 or 3 comma-separated numbers with a
// positive first share.
std::array<double, 3> data_split_shares(const std::string& split);

struct ParallelConfig {
  int pp = 1;
  int vpp = 1;  // model chunks per pipeline rank
  int cp = 1;
  CpLayout cp_layout = CpLayout::zigzag;
  int ep = 1;
  // additions:
  CpMode cp_mode = CpMode::ring;  // how attention crosses the cp group
  int cp_ulysses = 0;             // hybrid: all-to-all ranks inside a domain; 0: as cp_mode implies
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  // Transformer layers of each virtual pipeline stage, in pipeline order
  // (pp * vpp entries, each >= 1, summing to model.n_layers); the embedding
  // sits in the first, the head in the last. Empty: n_layers / (pp * vpp)
  // each (config-reference.md).
  std::vector<int> pp_layout;
  // dp = world_size / (pp * cp)

  bool operator==(const ParallelConfig&) const = default;
};

struct TrainConfig {
  int steps = 100;
  double lr = 3e-3;
  int warmup_steps = 10;
  double weight_decay = 0.0;
  double grad_clip = 1.0;  // 0: no clipping
  // additions:
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  // A step whose loss, aux losses or gradient norm is not finite: stop the
  // job (exit 1, no checkpoint of it) or skip its update.
  NonFinitePolicy on_nonfinite = NonFinitePolicy::stop;
  int max_skipped_steps = 5;       // skip: stop after this many skipped steps in a row
  double loss_spike_factor = 0.0;  // warn when loss > factor x running median; 0: off
  // bf16: GEMMs and attention read bf16 weights and activations (fp32
  // accumulation); master weights, AdamW state, gradients, the residual
  // stream, the loss and the norms stay fp32 (config-reference.md).
  Precision precision = Precision::fp32;
  // Activation recomputation (config-reference.md): what a layer keeps from
  // its forward for the backward, on the first recompute_layers layers of
  // each chunk (0: every layer).
  Recompute recompute = Recompute::none;
  int recompute_layers = 0;
  // AdamW moments sharded over each parameter's replicas (ZeRO-1), gradients
  // reduce-scattered and parameters all-gathered (parallel/dp/zero.hpp).
  OptimizerSharding optimizer_sharding = OptimizerSharding::none;
  // > 0: gradients are reduced in buckets of about this many MiB, each
  // started as soon as its gradients are final, overlapping the rest of the
  // backward (parallel/dp/grad_buckets.hpp); 0: one reduction per kind
  // after the pipeline has drained.
  double grad_bucket_mb = 0.0;
  // CUDA: fp32 GEMMs may run on the tensor cores in TF32 (10-bit mantissa
  // inputs, fp32 accumulation); false keeps them pedantic fp32, as the CPU.
  bool tf32 = false;

  bool operator==(const TrainConfig&) const = default;
};

struct RuntimeConfig {
  Backend backend = Backend::automatic;
  CommBackend comm = CommBackend::automatic;
  double timeout_s = 300;  // watchdog deadline for any single wait
  // additions:
  EpTransportChoice ep_transport = EpTransportChoice::automatic;  // MoE token exchange
  double ep_shm_limit_mb = 0;  // shared memory one MoE layer's exchange may hold; 0: no cap
  // DualPipeV's overlapped F+B slots run as two lanes, one micro-batch's EP
  // exchange in flight while the other computes (pp::ExecOptions::overlap_pairs)
  bool ep_overlap = true;
  int verify_every = 0;  // every N-th step runs twice and compares bitwise; 0: off
  // A rank whose median compute per step over a window of
  // output.rank_stats_every steps is this many times its stage peers' median,
  // and at least 5 ms per step more, in two windows in a row is named
  // (faults.md "Which rank is slow").
  double straggler_threshold = 1.3;
  // Communication operations each rank's flight recorder keeps (its last N;
  // comm/flight_recorder.hpp, faults.md); 0: off.
  int flight_records = 256;

  bool operator==(const RuntimeConfig&) const = default;
};

struct OutputConfig {
  std::string file = "trident-%j.h5";  // %j: Slurm job id, or "local-<timestamp>"
  int checkpoint_every = 0;            // steps; 0: only on signal and at the end
  std::string checkpoint_dir = "checkpoints";
  // sharded: every rank writes the slices it owns into its own file, under a
  // small index of virtual datasets; single: one file gathered on rank 0.
  CheckpointFormat checkpoint_format = CheckpointFormat::sharded;
  bool checkpoint_async = false;     // stage, return to training, write in the background
  int checkpoint_staging_mb = 1024;  // host staging buffer per rank (async saves)
  int keep_checkpoints = 0;          // complete checkpoints kept (0: all)
  // The fast resume tier (faults.md): every local_checkpoint_every steps each
  // rank's shard goes to this node-local directory ("" : off), with a copy
  // on a partner rank of another node.
  std::string local_checkpoint_dir;
  int local_checkpoint_every = 0;
  std::vector<int> activation_steps;  // steps at which activations are captured
  std::vector<int> activation_layers = {0};
  std::vector<int> activation_samples = {0};
  std::vector<std::string> activations = {"q", "k", "v", "attn_out", "router_logits"};
  bool timeline = true;
  int rank_stats_every = 10;  // steps per row of /ranks/steps; 0: off

  bool operator==(const OutputConfig&) const = default;
};

// [topology]: optional; replaces detection (CPU machines, tests, demos).
struct TopologyOverride {
  int nodes = 0;
  int devices_per_node = 0;
  int nvlink_domain = 0;  // 0: = devices_per_node

  bool operator==(const TopologyOverride&) const = default;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  ParallelConfig parallel;
  TrainConfig train;
  EvalConfig eval;
  RuntimeConfig runtime;
  OutputConfig output;
  std::optional<TopologyOverride> topology;

  std::string source;  // file the config came from ("<defaults>" if none)

  // The global batch: micro_batch_size * num_microbatches * dp sequences.

  // Where each explicitly given key came from, "section.key" -> "FILE:LINE"
  // or "--set section.key=value", so that validate_config() can point at the
  // line of a key involved in a cross-key rule. Not part of equality.
  std::map<std::string, std::string> key_origin;

  // data.packing = "documents": the length histogram of the documents (bin b:
  // lengths in [2^b, 2^(b+1))), read from the data files by `trident plan`
  // so that the cost model prices packed attention; empty: priced as one
  // causal sequence. Not a key, not part of equality.
  std::vector<int64_t> doc_lengths_log2;

  // Equal resolved values (source and key_origin are not compared).
  bool operator==(const Config& o) const {
    return model == o.model && data == o.data && parallel == o.parallel && train == o.train &&
           eval == o.eval && runtime == o.runtime && output == o.output && topology == o.topology;
  }
};

// Parse FILE (empty path: defaults only) and apply overrides "section.key=value".
// Throws InputError on the first problem.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Parse TOML text (used by tests and by checkpoints that carry their config).
Config parse_config_text(const std::string& toml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides = {});

// Core's cross-key rules (model shapes, data, output, topology, the mesh
// against the world), and those that need the world size (world_size <= 0:
// skip those). Throws InputError naming the key(s) and the rule. The parallel
// layers' rules are theirs; train::check_config() runs them all.
void validate_config(const Config& cfg, int world_size);

// Throws the InputError of a rule that relates `keys`: it points at where the
// first of them that was given explicitly came from (FILE:LINE or the --set),
// else at the config file. Every layer's config rules report through it.
[[noreturn]] void config_rule_failed(const Config& cfg, std::initializer_list<const char*> keys,
                                     const std::string& rule);

// The resolved config (all defaults filled) as TOML text; parse_config_text()
// of it gives back an equal Config.
std::string to_toml(const Config& cfg);

// Hash of what determines the model's parameters ([model] table): a
// checkpoint from another model is refused by comparing it.
std::string model_hash(const Config& cfg);

// Every key as "section.key", in the order of to_toml() (reference, tests).
std::vector<std::string> config_keys();

}  // namespace trident
