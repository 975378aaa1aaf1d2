// Hugging Face models <-> trident checkpoints (io/hf_model.hpp): config.json
// fields, tensor names, and the two conversions.
#include "trident/io/hf_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "trident/core/error.hpp"
#include "trident/io/checkpoint.hpp"

namespace trident::hf {

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::llama:
      return "LlamaForCausalLM";
    case Arch::mixtral:
      return "MixtralForCausalLM";
    case Arch::qwen3_moe:
      return "Qwen3MoeForCausalLM";
  }
  return "?";
}

const char* model_type(Arch a) {
  switch (a) {
    case Arch::llama:
      return "llama";
    case Arch::mixtral:
      return "mixtral";
    case Arch::qwen3_moe:
      return "qwen3_moe";
  }
  return "?";
}

namespace {

// One field under the names the two transformers generations write:
// transformers 4 first (the name every reader asks for), transformers 5
// second. This table is the one place that knows the renames; a file may
// use either name, or both when they agree. (rope_theta moving into
// rope_parameters is read by read_rope.)
struct FieldNames {
  std::optional<Arch> arch;  // none: every architecture
  const char* v4;
  const char* v5;
};
constexpr FieldNames kFieldNames[] = {
    {std::nullopt, "torch_dtype", "dtype"},
    {std::nullopt, "rope_scaling", "rope_parameters"},
    {Arch::qwen3_moe, "num_experts", "num_local_experts"},
};

// config.json with the fields read so far; every field must be taken by
// the architecture's rules or listed as carrying nothing for the model's
// arithmetic, else the conversion is refused.
class Fields {
 public:
  Fields(const json::Value& root, std::string path) : root_(root), path_(std::move(path)) {}
  // The architecture, once read: it chooses the rows of kFieldNames.
  void set_arch(Arch a) { arch_ = a; }
  // "path: name" with the name the file uses for key (both when it has none).
  std::string what(const std::string& key) const {
    const FieldNames* row = renamed(key);
    if (!row) return path_ + ": " + key;
    if (present(row->v5) && !present(row->v4)) return path_ + ": " + row->v5;
    if (present(row->v4)) return path_ + ": " + row->v4;
    return path_ + ": " + row->v4 + " (transformers 5: " + row->v5 + ")";
  }
  const json::Value* get(const std::string& key) {
    used_.insert(key);
    const FieldNames* row = renamed(key);
    if (!row) return present(key);
    used_.insert(row->v5);
    const json::Value *a = present(row->v4), *b = present(row->v5);
    if (a && b && a->dump() != b->dump())
      throw InputError(path_ + ": " + row->v5 + ": disagrees with " + row->v4 +
                       " (transformers 5 and 4 names of one field); give one");
    return a ? a : b;
  }
  int64_t need_int(const std::string& key) {
    const json::Value* v = get(key);
    if (!v) throw InputError(what(key) + ": missing (needed to size the model)");
    return v->as_int(what(key));
  }
  int64_t int_or(const std::string& key, int64_t dflt) {
    const json::Value* v = get(key);
    return v ? v->as_int(what(key)) : dflt;
  }
  double real_or(const std::string& key, double dflt) {
    const json::Value* v = get(key);
    return v ? v->as_double(what(key)) : dflt;
  }
  bool bool_or(const std::string& key, bool dflt) {
    const json::Value* v = get(key);
    return v ? v->as_bool(what(key)) : dflt;
  }
  // A field that trident honours only at one value.
  void require_bool(const std::string& key, bool want, const std::string& why) {
    if (bool_or(key, want) != want)
      throw InputError(what(key) + ": " + (want ? "false" : "true") + " is not supported: " + why);
  }
  void require_zero(const std::string& key, const std::string& why) {
    const double v = real_or(key, 0.0);
    if (v != 0.0) throw InputError(what(key) + ": must be 0 (" + why + ")");
  }
  void ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys) used_.insert(k);
  }
  // Every field was read by a rule.
  void check_all_used(const std::string& arch) const {
    for (const auto& [k, v] : root_.members(path_))
      if (!used_.count(k))
        throw InputError(path_ + ": " + k + ": a field trident does not know for " + arch +
                         "; refused rather than converted approximately");
  }

 private:
  const FieldNames* renamed(const std::string& key) const {
    for (const FieldNames& row : kFieldNames)
      if (key == row.v4 && (!row.arch || row.arch == arch_)) return &row;
    return nullptr;
  }
  const json::Value* present(const std::string& key) const {
    const json::Value* v = root_.find(key);
    return v && !v->is_null() ? v : nullptr;
  }

  const json::Value& root_;
  std::string path_;
  std::optional<Arch> arch_;
  std::set<std::string> used_;
};

int to_int(int64_t v, const std::string& what) {
  if (v < 0 || v > INT32_MAX) throw InputError(what + ": " + std::to_string(v) + " out of range");
  return int(v);
}

// A sliding window of every layer (model.window): null or absent is none.
int read_window(Fields& f, const std::string& key) {
  const json::Value* v = f.get(key);
  if (!v) return 0;
  const int64_t w = v->as_int(f.what(key));
  if (w < 1) throw InputError(f.what(key) + ": must be >= 1 or null (no window)");
  return to_int(w, f.what(key));
}

// Qwen3's window: with use_sliding_window, transformers 4 windows the layers
// from max_window_layers on (the ones before attend over the whole context)
// and transformers 5 windows every layer; both agree, and trident converts,
// only at max_window_layers = 0. Without it both fields are inert.
int read_qwen_window(Fields& f) {
  if (!f.bool_or("use_sliding_window", false)) {
    f.ignore({"sliding_window", "max_window_layers"});
    return 0;
  }
  const int w = read_window(f, "sliding_window");
  if (w == 0) throw InputError(f.what("sliding_window") + ": missing (use_sliding_window is true)");
  const json::Value* first = f.get("max_window_layers");
  if (!first || first->as_int(f.what("max_window_layers")) != 0)
    throw InputError(f.what("max_window_layers") + ": " +
                     (first ? first->number_text() : std::string("missing")) +
                     " with use_sliding_window: the layers below it attend over the whole "
                     "context, the rest in the window; trident has one window for every layer "
                     "(max_window_layers = 0)");
  return w;
}

// What rope_scaling (transformers 4) or rope_parameters (transformers 5)
// says besides the model keys it sets directly.
struct RopeSpec {
  std::string type = "default";
  double factor = 0.0;
  bool has_factor = false;
  std::optional<double> theta;  // transformers 5 keeps rope_theta here
};
using RopeMember = void (*)(const json::Value& v, const std::string& what, ModelConfig& m,
                            RopeSpec& s);

// Each member of the RoPE object and where it goes; any other is refused.
const std::map<std::string, RopeMember>& rope_members() {
  static const std::map<std::string, RopeMember> table = {
      {"rope_type", [](const json::Value& v, const std::string& w, ModelConfig&,
                       RopeSpec& s) { s.type = v.as_string(w); }},
      {"type", [](const json::Value& v, const std::string& w, ModelConfig&,
                  RopeSpec& s) { s.type = v.as_string(w); }},
      {"rope_theta", [](const json::Value& v, const std::string& w, ModelConfig&,
                        RopeSpec& s) { s.theta = v.as_double(w); }},
      {"factor",
       [](const json::Value& v, const std::string& w, ModelConfig&, RopeSpec& s) {
         s.factor = v.as_double(w);
         s.has_factor = true;
       }},
      {"low_freq_factor", [](const json::Value& v, const std::string& w, ModelConfig& m,
                             RopeSpec&) { m.rope_low_freq_factor = v.as_double(w); }},
      {"high_freq_factor", [](const json::Value& v, const std::string& w, ModelConfig& m,
                              RopeSpec&) { m.rope_high_freq_factor = v.as_double(w); }},
      {"original_max_position_embeddings",
       [](const json::Value& v, const std::string& w, ModelConfig& m, RopeSpec&) {
         m.rope_original_max_positions = to_int(v.as_int(w), w);
       }},
      {"partial_rotary_factor",
       [](const json::Value& v, const std::string& w, ModelConfig&, RopeSpec&) {
         if (v.as_double(w) != 1.0) throw InputError(w + ": only 1.0 (RoPE on every dimension)");
       }},
  };
  return table;
}

// The scaling named by spec.type into the model's keys.
void apply_rope_type(const RopeSpec& spec, const std::string& what, ModelConfig& m) {
  if (spec.type == "default") {
    m.rope_scaling = RopeScaling::none;
    return;
  }
  if (spec.type != "linear" && spec.type != "llama3")
    throw InputError(what + ".rope_type: \"" + spec.type +
                     "\" is not supported (default, linear, llama3)");
  if (!spec.has_factor || !(spec.factor > 0))
    throw InputError(what + ".factor: " + spec.type + " scaling needs a factor > 0");
  m.rope_scaling = spec.type == "linear" ? RopeScaling::linear : RopeScaling::llama3;
  m.rope_factor = spec.factor;
  if (spec.type == "llama3" && !(m.rope_high_freq_factor > m.rope_low_freq_factor))
    throw InputError(what + ".high_freq_factor: must be > low_freq_factor");
}

// rope_theta and rope_scaling (transformers 4) or rope_parameters with
// rope_theta inside (transformers 5) into the model's RoPE keys.
void read_rope(Fields& f, Arch arch, ModelConfig& m) {
  const json::Value* theta = f.get("rope_theta");
  const json::Value* r = f.get("rope_scaling");  // or rope_parameters (kFieldNames)
  const std::string key = f.what("rope_scaling");
  RopeSpec spec;
  if (r) {
    for (const auto& [k, v] : r->members(key)) {
      const std::string w = key + "." + k;
      const auto it = rope_members().find(k);
      if (it == rope_members().end())
        throw InputError(w + ": a RoPE parameter trident does not know; refused");
      it->second(v, w, m, spec);
    }
  }
  const double default_theta = arch == Arch::mixtral ? 1e6 : 10000.0;
  m.rope_theta =
      theta ? theta->as_double(f.what("rope_theta")) : spec.theta.value_or(default_theta);
  if (theta && spec.theta && *spec.theta != m.rope_theta)
    throw InputError(key + ".rope_theta: disagrees with rope_theta");
  if (!(m.rope_theta > 0)) throw InputError(f.what("rope_theta") + ": must be > 0");
  apply_rope_type(spec, key, m);
}

// The fields of one architecture: its experts, and what it must not use.
void read_arch_fields(Fields& f, Arch arch, ModelConfig& m) {
  switch (arch) {
    case Arch::llama:
      f.require_bool("mlp_bias", false, "trident's FFN has no bias");
      m.n_experts = 0;
      m.moe_every = 1;
      break;
    case Arch::mixtral:
      m.window = read_window(f, "sliding_window");  // every layer's, when set
      f.require_zero("router_jitter_noise", "trident's router has no jitter");
      m.n_experts = to_int(f.need_int("num_local_experts"), f.what("num_local_experts"));
      m.top_k = to_int(f.int_or("num_experts_per_tok", 2), f.what("num_experts_per_tok"));
      m.moe_every = 1;
      m.norm_topk = true;  // Mixtral renormalises the chosen k
      break;
    case Arch::qwen3_moe: {
      m.window = read_qwen_window(f);
      m.qk_norm = true;
      m.n_experts = to_int(f.need_int("num_experts"), f.what("num_experts"));
      m.top_k = to_int(f.need_int("num_experts_per_tok"), f.what("num_experts_per_tok"));
      m.moe_ffn_hidden =
          to_int(f.need_int("moe_intermediate_size"), f.what("moe_intermediate_size"));
      m.moe_every = to_int(f.int_or("decoder_sparse_step", 1), f.what("decoder_sparse_step"));
      if (m.moe_every < 1) throw InputError(f.what("decoder_sparse_step") + ": must be >= 1");
      m.norm_topk = f.bool_or("norm_topk_prob", false);
      if (const json::Value* dl = f.get("mlp_only_layers"))
        for (const json::Value& l : dl->items(f.what("mlp_only_layers"))) {
          const int layer = to_int(l.as_int(f.what("mlp_only_layers")), f.what("mlp_only_layers"));
          if (layer < m.n_layers && std::find(m.dense_layers.begin(), m.dense_layers.end(),
                                              layer) == m.dense_layers.end())
            m.dense_layers.push_back(layer);
        }
      std::sort(m.dense_layers.begin(), m.dense_layers.end());
      break;
    }
  }
}

// architectures and model_type: which model this is.
Arch read_architecture(Fields& f) {
  Arch arch = Arch::llama;
  const json::Value* archs = f.get("architectures");
  if (!archs) throw InputError(f.what("architectures") + ": missing");
  const auto& list = archs->items(f.what("architectures"));
  if (list.size() != 1)
    throw InputError(f.what("architectures") + ": must name exactly one architecture");
  const std::string& a = list[0].as_string(f.what("architectures"));
  if (a == "LlamaForCausalLM")
    arch = Arch::llama;
  else if (a == "MixtralForCausalLM")
    arch = Arch::mixtral;
  else if (a == "Qwen3MoeForCausalLM")
    arch = Arch::qwen3_moe;
  else
    throw InputError(f.what("architectures") + ": \"" + a +
                     "\" is not supported (LlamaForCausalLM, MixtralForCausalLM, "
                     "Qwen3MoeForCausalLM)");
  if (const json::Value* mt = f.get("model_type")) {
    if (mt->as_string(f.what("model_type")) != model_type(arch))
      throw InputError(f.what("model_type") + ": \"" + mt->as_string("") + "\" is not \"" +
                       model_type(arch) + "\" (" + a + ")");
  }
  return arch;
}

}  // namespace

namespace {

// The sizes: vocabulary, widths, layers, heads and the head dimension.
void read_dimensions(Fields& f, ModelConfig& m) {
  m.vocab_size = to_int(f.need_int("vocab_size"), f.what("vocab_size"));
  m.d_model = to_int(f.need_int("hidden_size"), f.what("hidden_size"));
  m.ffn_hidden = to_int(f.need_int("intermediate_size"), f.what("intermediate_size"));
  m.n_layers = to_int(f.need_int("num_hidden_layers"), f.what("num_hidden_layers"));
  m.n_heads = to_int(f.need_int("num_attention_heads"), f.what("num_attention_heads"));
  m.n_kv_heads = to_int(f.int_or("num_key_value_heads", m.n_heads), f.what("num_key_value_heads"));
  if (m.n_heads < 1 || m.n_kv_heads < 1 || m.n_heads % m.n_kv_heads != 0)
    throw InputError(f.what("num_key_value_heads") +
                     ": must divide num_attention_heads (grouped-query attention)");
  const int64_t head_dim = f.int_or("head_dim", 0);
  if (head_dim == 0 && m.d_model % m.n_heads != 0)
    throw InputError(f.what("num_attention_heads") + ": must divide hidden_size (no head_dim)");
  const int64_t D = head_dim ? head_dim : m.d_model / m.n_heads;
  if (D % 2 != 0) throw InputError(f.what("head_dim") + ": must be even (RoPE rotates pairs)");
  // head_dim enters the config only where it differs from what the
  // default derives, so that a model stays the same trident model either way.
  m.head_dim_key = D == m.d_model / m.n_heads && m.d_model % m.n_heads == 0 ? 0 : int(D);
}

// What every architecture has and trident honours at one value only.
void refuse_unsupported(Fields& f) {
  const json::Value* act = f.get("hidden_act");
  if (act && act->as_string(f.what("hidden_act")) != "silu")
    throw InputError(f.what("hidden_act") + ": \"" + act->as_string("") +
                     "\" is not supported (silu: the SwiGLU FFN)");
  f.require_bool("attention_bias", false, "trident's projections have no bias");
  f.require_zero("attention_dropout", "trident has no dropout");
  f.require_zero("hidden_dropout", "trident has no dropout");
  if (const json::Value* ptp = f.get("pretraining_tp"))
    if (ptp->as_int(f.what("pretraining_tp")) != 1)
      throw InputError(f.what("pretraining_tp") + ": only 1");
}

}  // namespace

HfConfig read_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json::Value root = json::parse(text, path);
  root.members(path);  // an object
  Fields f(root, path);
  HfConfig out;
  out.arch = read_architecture(f);
  f.set_arch(out.arch);
  ModelConfig& m = out.model;
  m = ModelConfig{};
  read_dimensions(f, m);
  m.norm_eps = f.real_or("rms_norm_eps", out.arch == Arch::mixtral ? 1e-5 : 1e-6);
  if (!(m.norm_eps > 0)) throw InputError(f.what("rms_norm_eps") + ": must be > 0");
  m.tie_embeddings = f.bool_or("tie_word_embeddings", false);
  read_rope(f, out.arch, m);
  refuse_unsupported(f);
  out.max_position_embeddings = f.int_or("max_position_embeddings", 0);
  if (const json::Value* d = f.get("torch_dtype")) out.dtype = d->as_string(f.what("torch_dtype"));
  // Fields that carry nothing for the model's arithmetic (token ids,
  // generation and output switches, initialisation of new weights).
  f.ignore({"bos_token_id", "eos_token_id", "pad_token_id", "transformers_version", "use_cache",
            "initializer_range", "output_router_logits", "return_dict", "output_hidden_states",
            "output_attentions", "torchscript", "_name_or_path", "tokenizer_class",
            "router_aux_loss_coef"});
  m.router = RouterScoring::softmax;
  m.capacity_factor = 0.0;
  m.z_loss_coef = 0.0;
  read_arch_fields(f, out.arch, m);
  if (m.n_experts > 0 && (m.top_k < 1 || m.top_k > m.n_experts))
    throw InputError(f.what("num_experts_per_tok") + ": must be in [1, number of experts]");
  if (m.n_experts > 0 && m.moe_every > m.n_layers) m.n_experts = 0;  // no sparse layer at all
  f.check_all_used(arch_name(out.arch));
  return out;
}

Arch arch_of(const ModelConfig& m, const std::string& source) {
  auto refuse = [&](const std::string& key, const std::string& why) {
    throw InputError(source + ": model." + key + ": " + why);
  };
  if (m.router != RouterScoring::softmax)
    refuse("router", "\"sigmoid_bias\" has no Hugging Face architecture here (softmax only)");
  if (m.n_experts == 0) {
    if (m.qk_norm) refuse("qk_norm", "a dense model with q/k norms (Qwen3) is not supported");
    if (m.window > 0)
      refuse("window", "LlamaForCausalLM has no sliding window (Mixtral and Qwen3-MoE have)");
    return Arch::llama;
  }
  if (m.qk_norm) return Arch::qwen3_moe;
  if (m.moe_every != 1 || !m.dense_layers.empty())
    refuse("moe_every", "Mixtral has an MoE FFN in every layer (moe_every = 1, no dense_layers)");
  if (m.moe_ffn_hidden != 0 && m.moe_ffn_hidden != m.ffn_hidden)
    refuse("moe_ffn_hidden", "Mixtral's experts have the FFN's hidden size");
  if (!m.norm_topk) refuse("norm_topk", "Mixtral renormalises the chosen k weights (true)");
  return Arch::mixtral;
}

std::vector<TensorName> tensor_names(Arch a, const ModelConfig& m) {
  const int64_t d = m.d_model, V = m.vocab_size, H = m.n_heads, Hkv = m.n_kv_heads,
                D = m.head_dim(), f = m.ffn_hidden, fe = m.expert_ffn_hidden();
  std::vector<TensorName> out;
  out.push_back({"embedding", "model.embed_tokens.weight", {V, d}});
  for (int l = 0; l < m.n_layers; ++l) {
    const std::string t = "layers." + std::to_string(l) + ".";
    const std::string h = "model.layers." + std::to_string(l) + ".";
    out.push_back({t + "attn.norm", h + "input_layernorm.weight", {d}});
    out.push_back({t + "attn.wq", h + "self_attn.q_proj.weight", {H * D, d}});
    out.push_back({t + "attn.wk", h + "self_attn.k_proj.weight", {Hkv * D, d}});
    out.push_back({t + "attn.wv", h + "self_attn.v_proj.weight", {Hkv * D, d}});
    out.push_back({t + "attn.wo", h + "self_attn.o_proj.weight", {d, H * D}});
    if (m.qk_norm) {
      out.push_back({t + "attn.q_norm", h + "self_attn.q_norm.weight", {D}});
      out.push_back({t + "attn.k_norm", h + "self_attn.k_norm.weight", {D}});
    }
    out.push_back({t + "ffn_norm", h + "post_attention_layernorm.weight", {d}});
    if (!m.is_moe_layer(l)) {
      out.push_back({t + "ffn.w_gate", h + "mlp.gate_proj.weight", {f, d}});
      out.push_back({t + "ffn.w_up", h + "mlp.up_proj.weight", {f, d}});
      out.push_back({t + "ffn.w_down", h + "mlp.down_proj.weight", {d, f}});
      continue;
    }
    const bool mixtral = a == Arch::mixtral;
    const std::string moe = h + (mixtral ? "block_sparse_moe." : "mlp.");
    out.push_back({t + "moe.router", moe + "gate.weight", {m.n_experts, d}});
    for (int e = 0; e < m.n_experts; ++e) {
      const std::string te = t + "moe.experts." + std::to_string(e) + ".";
      const std::string he = moe + "experts." + std::to_string(e) + ".";
      out.push_back({te + "w_gate", he + (mixtral ? "w1.weight" : "gate_proj.weight"), {fe, d}});
      out.push_back({te + "w_up", he + (mixtral ? "w3.weight" : "up_proj.weight"), {fe, d}});
      out.push_back({te + "w_down", he + (mixtral ? "w2.weight" : "down_proj.weight"), {d, fe}});
    }
  }
  out.push_back({"final_norm", "model.norm.weight", {d}});
  if (!m.tie_embeddings) out.push_back({"lm_head", "lm_head.weight", {V, d}});
  return out;
}

json::Value make_config(Arch a, const ModelConfig& m, safetensors::DType dtype,
                        int64_t max_positions) {
  using json::Value;
  Value c = Value::object();
  Value archs = Value::array();
  archs.push(Value::string(arch_name(a)));
  c.set("architectures", std::move(archs));
  c.set("model_type", Value::string(model_type(a)));
  c.set("vocab_size", Value::integer(m.vocab_size));
  c.set("hidden_size", Value::integer(m.d_model));
  c.set("intermediate_size", Value::integer(m.ffn_hidden));
  c.set("num_hidden_layers", Value::integer(m.n_layers));
  c.set("num_attention_heads", Value::integer(m.n_heads));
  c.set("num_key_value_heads", Value::integer(m.n_kv_heads));
  c.set("head_dim", Value::integer(m.head_dim()));
  c.set("hidden_act", Value::string("silu"));
  c.set("rms_norm_eps", Value::real(m.norm_eps));
  c.set("rope_theta", Value::real(m.rope_theta));
  if (m.rope_scaling == RopeScaling::none) {
    c.set("rope_scaling", Value());
  } else {
    Value r = Value::object();
    r.set("rope_type", Value::string(m.rope_scaling == RopeScaling::linear ? "linear" : "llama3"));
    r.set("factor", Value::real(m.rope_factor));
    if (m.rope_scaling == RopeScaling::llama3) {
      r.set("low_freq_factor", Value::real(m.rope_low_freq_factor));
      r.set("high_freq_factor", Value::real(m.rope_high_freq_factor));
      r.set("original_max_position_embeddings", Value::integer(m.rope_original_max_positions));
    }
    c.set("rope_scaling", std::move(r));
  }
  c.set("max_position_embeddings", Value::integer(max_positions));
  c.set("tie_word_embeddings", Value::boolean(m.tie_embeddings));
  c.set("attention_bias", Value::boolean(false));
  c.set("attention_dropout", Value::real(0.0));
  c.set("torch_dtype", Value::string(dtype == safetensors::DType::bf16  ? "bfloat16"
                                     : dtype == safetensors::DType::f16 ? "float16"
                                                                        : "float32"));
  switch (a) {
    case Arch::llama:
      c.set("mlp_bias", Value::boolean(false));
      break;
    case Arch::mixtral:
      c.set("num_local_experts", Value::integer(m.n_experts));
      c.set("num_experts_per_tok", Value::integer(m.top_k));
      c.set("sliding_window", m.window > 0 ? Value::integer(m.window) : Value());
      c.set("router_jitter_noise", Value::real(0.0));
      break;
    case Arch::qwen3_moe: {
      c.set("num_experts", Value::integer(m.n_experts));
      c.set("num_experts_per_tok", Value::integer(m.top_k));
      c.set("moe_intermediate_size", Value::integer(m.expert_ffn_hidden()));
      c.set("decoder_sparse_step", Value::integer(m.moe_every));
      c.set("norm_topk_prob", Value::boolean(m.norm_topk));
      Value dense = Value::array();
      std::vector<int> layers = m.dense_layers;
      std::sort(layers.begin(), layers.end());
      for (int l : layers) dense.push(Value::integer(l));
      c.set("mlp_only_layers", std::move(dense));
      c.set("use_sliding_window", Value::boolean(m.window > 0));
      if (m.window > 0) {
        c.set("sliding_window", Value::integer(m.window));
        c.set("max_window_layers", Value::integer(0));  // every layer (read_qwen_window)
      }
      break;
    }
  }
  return c;
}

namespace {

// Transformers 5 may store a layer's experts fused: gate_up_proj
// [E, 2 fe, d] (each expert's gate rows, then its up rows) and down_proj
// [E, d, fe]. Returns expert e's slice of `which` (0 gate, 1 up, 2 down),
// or false when the layer is not stored that way.
bool read_fused_expert(const safetensors::ModelFiles& files, const std::string& moe_prefix,
                       const ModelConfig& m, int e, int which, std::vector<float>& out) {
  const int64_t E = m.n_experts, d = m.d_model, fe = m.expert_ffn_hidden();
  const std::string name = moe_prefix + (which < 2 ? "experts.gate_up_proj" : "experts.down_proj");
  if (!files.find(name)) return false;
  const std::vector<int64_t> shape =
      which < 2 ? std::vector<int64_t>{E, 2 * fe, d} : std::vector<int64_t>{E, d, fe};
  const std::vector<float> all = files.read(name, shape, "config.json");
  const int64_t per = which < 2 ? 2 * fe * d : d * fe;
  const int64_t off = e * per + (which == 1 ? fe * d : 0);
  const int64_t n = which < 2 ? fe * d : d * fe;
  out.assign(all.begin() + off, all.begin() + off + n);
  return true;
}

std::string moe_prefix_of(const std::string& hf_name) {
  const size_t p = hf_name.find("experts.");
  return hf_name.substr(0, p);
}

// Transformers 5 names Mixtral's MoE block mlp (block_sparse_moe in 4.x).
std::string v5_mixtral_name(std::string hf_name) {
  const size_t bs = hf_name.find("block_sparse_moe.");
  if (bs != std::string::npos) hf_name.replace(bs, 17, "mlp.");
  return hf_name;
}

// Every tensor of the files must be one the model reads: a bias or an
// extra layer would otherwise be dropped silently. Rotary frequency
// buffers that old Llama files carry are recomputed from config.json.
void check_every_tensor_used(const std::string& dir, const safetensors::ModelFiles& files,
                             const std::vector<TensorName>& names, const HfConfig& hc) {
  std::set<std::string> expected;
  for (const auto& n : names) expected.insert({n.hf, v5_mixtral_name(n.hf)});
  for (const std::string& n : files.names()) {
    if (expected.count(n)) continue;
    if (n.ends_with(".rotary_emb.inv_freq")) continue;
    if (n == "lm_head.weight" && hc.model.tie_embeddings) continue;  // checked below
    const bool fused = n.find(".experts.gate_up_proj") != std::string::npos ||
                       n.find(".experts.down_proj") != std::string::npos;
    if (fused) continue;  // read by read_values
    throw InputError(dir + ": tensor '" + n + "' has no place in " + arch_name(hc.arch) +
                     " as config.json describes it; refused rather than dropped");
  }
}

// The parameters in `names` order, as float32.
std::vector<std::vector<float>> read_values(const std::string& dir,
                                            const safetensors::ModelFiles& files,
                                            const std::vector<TensorName>& names,
                                            const HfConfig& hc) {
  std::vector<std::vector<float>> values;
  for (const auto& n : names) {
    std::vector<float> v;
    if (!files.find(n.hf) && n.trident.find(".moe.experts.") != std::string::npos) {
      const int e = std::stoi(n.trident.substr(n.trident.find("experts.") + 8));
      const std::string tail = n.trident.substr(n.trident.rfind('.') + 1);
      const int which = tail == "w_gate" ? 0 : tail == "w_up" ? 1 : 2;
      const std::string prefix = v5_mixtral_name(moe_prefix_of(n.hf));
      if (!read_fused_expert(files, prefix, hc.model, e, which, v))
        throw InputError(dir + ": missing tensor '" + n.hf + "'");
    } else if (!files.find(n.hf) && files.find(v5_mixtral_name(n.hf))) {
      v = files.read(v5_mixtral_name(n.hf), n.shape, "config.json");
    } else {
      v = files.read(n.hf, n.shape, "config.json");
    }
    values.push_back(std::move(v));
  }
  return values;
}

}  // namespace

void convert_from_hf(const std::string& dir, const std::string& out_ckpt,
                     const std::string& config_out) {
  const std::string cfg_path = dir + "/config.json";
  const HfConfig hc = read_config(cfg_path);
  Config cfg;
  cfg.model = hc.model;
  cfg.source = cfg_path;
  validate_config(cfg, 0);
  const safetensors::ModelFiles files(dir);
  const std::vector<TensorName> names = tensor_names(hc.arch, hc.model);
  check_every_tensor_used(dir, files, names, hc);
  std::vector<CheckpointTensor> tensors;
  std::vector<float> zeros;
  const std::vector<std::vector<float>> values = read_values(dir, files, names, hc);
  if (hc.model.tie_embeddings && files.find("lm_head.weight")) {
    // transformers ties the head to the embedding and ignores a stored head;
    // one that differs would make this file mean two models.
    const std::vector<float> head =
        files.read("lm_head.weight", {hc.model.vocab_size, hc.model.d_model}, "config.json");
    if (std::memcmp(head.data(), values[0].data(), head.size() * sizeof(float)) != 0)
      throw InputError(dir +
                       ": tensor 'lm_head.weight' differs from model.embed_tokens.weight "
                       "but config.json ties them (tie_word_embeddings)");
  }
  int64_t largest = 0;
  for (const auto& n : names) {
    int64_t k = 1;
    for (int64_t s : n.shape) k *= s;
    largest = std::max(largest, k);
  }
  zeros.assign(size_t(largest), 0.0f);
  for (size_t i = 0; i < names.size(); ++i) {
    tensors.push_back({"param/" + names[i].trident, names[i].shape, values[i].data()});
    tensors.push_back({"adam_m/" + names[i].trident, names[i].shape, zeros.data()});
    tensors.push_back({"adam_v/" + names[i].trident, names[i].shape, zeros.data()});
  }
  CheckpointMeta meta;
  meta.step = 0;
  meta.optimizer_steps = 0;
  meta.model_hash = model_hash(cfg);
  meta.config_toml = to_toml(cfg);
  meta.world_size = 1;
  if (!config_out.empty()) {
    const std::string tmp = config_out + ".tmp";
    {
      std::ofstream o(tmp, std::ios::trunc);
      o << "# " << arch_name(hc.arch) << " from " << dir
        << " (trident convert hf). [model] is the checkpoint's model; the\n"
           "# other tables are defaults: set the data, mesh and training there.\n"
        << to_toml(cfg);
      if (!o) throw InputError(config_out + ": cannot write");
    }
    if (std::rename(tmp.c_str(), config_out.c_str()) != 0)
      throw InputError(config_out + ": cannot write");
  }
  write_checkpoint_file(out_ckpt, meta, tensors);
}

void convert_to_hf(const std::string& ckpt, const std::string& out_dir, safetensors::DType dtype,
                   uint64_t max_shard_bytes) {
  CheckpointReader r(ckpt);
  const Config cfg = parse_config_text(r.meta().config_toml, ckpt + " (config_toml)");
  const Arch arch = arch_of(cfg.model, ckpt);
  const std::vector<TensorName> names = tensor_names(arch, cfg.model);
  std::vector<safetensors::OutTensor> out;
  out.reserve(names.size());
  for (const auto& n : names) {
    int64_t numel = 1;
    for (int64_t s : n.shape) numel *= s;
    std::vector<float> v(static_cast<size_t>(numel));
    r.read("param/" + n.trident, n.shape, v.data());
    safetensors::OutTensor t;
    t.name = n.hf;
    t.dtype = dtype;
    t.shape = n.shape;
    if (dtype == safetensors::DType::f32) {
      t.data.resize(v.size() * 4);
      if (!v.empty()) std::memcpy(t.data.data(), v.data(), v.size() * 4);
    } else {
      const bool bf16 = dtype == safetensors::DType::bf16;
      t.data.resize(v.size() * 2);
      for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = bf16 ? safetensors::f32_to_bf16(v[i]) : safetensors::f32_to_f16(v[i]);
        std::memcpy(t.data.data() + 2 * i, &h, 2);
      }
    }
    out.push_back(std::move(t));
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw InputError(out_dir + ": cannot create: " + ec.message());
  const int64_t max_pos =
      cfg.model.rope_scaling == RopeScaling::llama3
          ? int64_t(std::llround(cfg.model.rope_original_max_positions * cfg.model.rope_factor))
          : int64_t(cfg.data.seq_len);
  // Stale shards of an earlier export would sit next to the new index.
  for (const auto& e : std::filesystem::directory_iterator(out_dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 12 && n.substr(n.size() - 12) == ".safetensors") std::filesystem::remove(e, ec);
    if (n == "model.safetensors.index.json") std::filesystem::remove(e, ec);
  }
  safetensors::write_model(out_dir, out, max_shard_bytes, {{"format", "pt"}});
  const std::string path = out_dir + "/config.json";
  {
    std::ofstream o(path + ".tmp", std::ios::trunc);
    o << make_config(arch, cfg.model, dtype, max_pos).dump() << "\n";
    if (!o) throw InputError(path + ": cannot write");
  }
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0)
    throw InputError(path + ": cannot write");
}

}  // namespace trident::hf
