// Config loading: TOML text -> Config, `--set` overrides, the per-key and
// cross-key rules, and the resolved config back to TOML.
//
// Every key is described once in key_table() (type, where it lives in Config,
// its allowed range); parsing, overrides, to_toml() and config_keys() all walk
// that table, so a key added there is parsed, checked and written back.
#include "trident/core/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "trident/core/error.hpp"

namespace trident {
namespace {

enum class Kind { Int, UInt64, Float, Bool, String, IntList, StringList, Blend };

constexpr double kInf = std::numeric_limits<double>::infinity();

struct KeyDef {
  KeyDef(std::string sec, std::string nm, Kind kd, std::function<void*(Config&)> r)
      : section(std::move(sec)), name(std::move(nm)), kind(kd), ref(std::move(r)) {}

  std::string section, name;
  Kind kind;
  std::function<void*(Config&)> ref;
  // Numeric range (Int, UInt64, Float, and the elements of IntList).
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  // Allowed strings (String and the elements of StringList); empty: any.
  std::vector<std::string> choices;
  bool nonempty = false;  // String: must not be ""
  bool unique = false;    // lists: no element twice
  // String keys held as an enum: read and write the field by its spelling.
  std::function<std::string(Config&)> get_choice;
  std::function<void(Config&, const std::string&)> set_choice;

  std::string full() const { return section + "." + name; }
};

// Small builders so that the table below reads as a schema.
KeyDef int_key(const char* sec, const char* name, std::function<void*(Config&)> ref, double lo,
               double hi = kInf) {
  KeyDef k{sec, name, Kind::Int, std::move(ref)};
  k.lo = lo;
  k.hi = hi;
  return k;
}
KeyDef float_key(const char* sec, const char* name, std::function<void*(Config&)> ref, double lo,
                 bool lo_open, double hi = kInf, bool hi_open = false) {
  KeyDef k{sec, name, Kind::Float, std::move(ref)};
  k.lo = lo;
  k.lo_open = lo_open;
  k.hi = hi;
  k.hi_open = hi_open;
  return k;
}
// A key held as an enum (core/config.hpp's ConfigNames); `choices` lists
// its spellings in the order the error message names them.
template <typename F>
KeyDef choice_key(const char* sec, const char* name, F field, std::vector<std::string> choices) {
  using E = std::remove_reference_t<decltype(field(std::declval<Config&>()))>;
  KeyDef k{sec, name, Kind::String, [field](Config& c) -> void* { return &field(c); }};
  for (const auto& ch : choices)
    if (!parse_config_name<E>(ch)) throw std::logic_error("config: no value spelt " + ch);
  k.choices = std::move(choices);
  k.get_choice = [field](Config& c) { return config_name(field(c)); };
  k.set_choice = [field](Config& c, const std::string& v) { field(c) = *parse_config_name<E>(v); };
  return k;
}
KeyDef string_key(const char* sec, const char* name, std::function<void*(Config&)> ref,
                  bool nonempty) {
  KeyDef k{sec, name, Kind::String, std::move(ref)};
  k.nonempty = nonempty;
  return k;
}

TopologyOverride& topo_of(Config& c) {
  if (!c.topology) c.topology.emplace();
  return *c.topology;
}

const std::vector<std::string> kSections = {"model", "data",    "parallel", "train",
                                            "eval",  "runtime", "output",   "topology"};

const std::vector<KeyDef>& key_table() {
  static const std::vector<KeyDef> table = [] {
    std::vector<KeyDef> t;
    // [model]
    t.push_back(int_key(
        "model", "vocab_size", [](Config& c) { return &c.model.vocab_size; }, 2));
    t.push_back(int_key(
        "model", "d_model", [](Config& c) { return &c.model.d_model; }, 1));
    t.push_back(int_key(
        "model", "n_layers", [](Config& c) { return &c.model.n_layers; }, 1));
    t.push_back(int_key(
        "model", "n_heads", [](Config& c) { return &c.model.n_heads; }, 1));
    t.push_back(int_key(
        "model", "n_kv_heads", [](Config& c) { return &c.model.n_kv_heads; }, 1));
    t.push_back(int_key(
        "model", "ffn_hidden", [](Config& c) { return &c.model.ffn_hidden; }, 1));
    t.push_back(int_key(
        "model", "n_experts", [](Config& c) { return &c.model.n_experts; }, 0));
    t.push_back(int_key(
        "model", "top_k", [](Config& c) { return &c.model.top_k; }, 1));
    t.push_back(int_key(
        "model", "moe_every", [](Config& c) { return &c.model.moe_every; }, 1));
    t.push_back(choice_key("model", "router", [](Config & c) -> auto& { return c.model.router; },
                           {"softmax", "sigmoid_bias"}));
    t.push_back(float_key(
        "model", "capacity_factor", [](Config& c) { return &c.model.capacity_factor; }, 0, false));
    t.push_back(float_key(
        "model", "aux_loss_coef", [](Config& c) { return &c.model.aux_loss_coef; }, 0, false));
    t.push_back(float_key(
        "model", "rope_theta", [](Config& c) { return &c.model.rope_theta; }, 0, true));
    t.push_back({"model", "norm_topk", Kind::Bool, [](Config& c) { return &c.model.norm_topk; }});
    t.push_back(float_key(
        "model", "z_loss_coef", [](Config& c) { return &c.model.z_loss_coef; }, 0, false));
    t.push_back(float_key(
        "model", "router_bias_rate", [](Config& c) { return &c.model.router_bias_rate; }, 0,
        false));
    t.push_back(float_key(
        "model", "init_std", [](Config& c) { return &c.model.init_std; }, 0, true));
    t.push_back(int_key(
        "model", "window", [](Config& c) { return &c.model.window; }, 0));
    t.push_back(int_key(
        "model", "head_dim", [](Config& c) { return &c.model.head_dim_key; }, 0));
    t.push_back(int_key(
        "model", "moe_ffn_hidden", [](Config& c) { return &c.model.moe_ffn_hidden; }, 0));
    {
      KeyDef k{"model", "dense_layers", Kind::IntList,
               [](Config& c) { return &c.model.dense_layers; }};
      k.lo = 0;
      k.unique = true;
      t.push_back(k);
    }
    t.push_back(
        {"model", "tie_embeddings", Kind::Bool, [](Config& c) { return &c.model.tie_embeddings; }});
    t.push_back({"model", "qk_norm", Kind::Bool, [](Config& c) { return &c.model.qk_norm; }});
    t.push_back(float_key(
        "model", "norm_eps", [](Config& c) { return &c.model.norm_eps; }, 0, true));
    t.push_back(choice_key("model", "rope_scaling",
                           [](Config & c) -> auto& { return c.model.rope_scaling; },
                           {"none", "linear", "llama3"}));
    t.push_back(float_key(
        "model", "rope_factor", [](Config& c) { return &c.model.rope_factor; }, 0, true));
    t.push_back(float_key(
        "model", "rope_low_freq_factor", [](Config& c) { return &c.model.rope_low_freq_factor; }, 0,
        true));
    t.push_back(float_key(
        "model", "rope_high_freq_factor", [](Config& c) { return &c.model.rope_high_freq_factor; },
        0, true));
    t.push_back(int_key(
        "model", "rope_original_max_positions",
        [](Config& c) { return &c.model.rope_original_max_positions; }, 1));
    // [data]
    t.push_back(choice_key("data", "task", [](Config & c) -> auto& { return c.data.task; },
                           {"recall", "copy", "tokens"}));
    t.push_back(int_key(
        "data", "seq_len", [](Config& c) { return &c.data.seq_len; }, 1));
    t.push_back(int_key(
        "data", "micro_batch_size", [](Config& c) { return &c.data.micro_batch_size; }, 1));
    t.push_back(int_key(
        "data", "num_microbatches", [](Config& c) { return &c.data.num_microbatches; }, 1));
    {
      KeyDef k{"data", "seed", Kind::UInt64, [](Config& c) { return &c.data.seed; }};
      k.lo = 0;
      t.push_back(k);
    }
    t.push_back(string_key(
        "data", "token_file", [](Config& c) { return &c.data.token_file; }, false));
    t.push_back(choice_key("data", "token_dtype",
                           [](Config & c) -> auto& { return c.data.token_dtype; },
                           {"uint16", "uint32"}));
    t.push_back(choice_key("data", "format", [](Config & c) -> auto& { return c.data.format; },
                           {"flat", "megatron"}));
    t.push_back(string_key(
        "data", "prefix", [](Config& c) { return &c.data.prefix; }, false));
    t.push_back(int_key(
        "data", "eod_token", [](Config& c) { return &c.data.eod_token; }, -1));
    t.push_back({"data", "blend", Kind::Blend, [](Config& c) { return &c.data.blend; }});
    t.push_back(string_key(
        "data", "split", [](Config& c) { return &c.data.split; }, true));
    t.push_back(choice_key("data", "packing", [](Config & c) -> auto& { return c.data.packing; },
                           {"none", "documents"}));
    t.push_back(
        {"data", "reset_positions", Kind::Bool, [](Config& c) { return &c.data.reset_positions; }});
    // [parallel]
    t.push_back(int_key(
        "parallel", "pp", [](Config& c) { return &c.parallel.pp; }, 1));
    t.push_back(int_key(
        "parallel", "vpp", [](Config& c) { return &c.parallel.vpp; }, 1));
    t.push_back(int_key(
        "parallel", "cp", [](Config& c) { return &c.parallel.cp; }, 1));
    t.push_back(choice_key("parallel", "cp_layout",
                           [](Config & c) -> auto& { return c.parallel.cp_layout; },
                           {"zigzag", "contiguous", "docs"}));
    t.push_back(int_key(
        "parallel", "ep", [](Config& c) { return &c.parallel.ep; }, 1));
    t.push_back(choice_key("parallel", "schedule",
                           [](Config & c) -> auto& { return c.parallel.schedule; },
                           {"afab", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev"}));
    t.push_back(choice_key("parallel", "cp_mode",
                           [](Config & c) -> auto& { return c.parallel.cp_mode; },
                           {"ring", "ulysses", "hybrid"}));
    t.push_back(int_key(
        "parallel", "cp_ulysses", [](Config& c) { return &c.parallel.cp_ulysses; }, 0));
    {
      KeyDef k{"parallel", "pp_layout", Kind::IntList,
               [](Config& c) { return &c.parallel.pp_layout; }};
      k.lo = 1;  // a stage without a layer
      t.push_back(k);
    }
    // [train]
    t.push_back(int_key(
        "train", "steps", [](Config& c) { return &c.train.steps; }, 1));
    t.push_back(float_key(
        "train", "lr", [](Config& c) { return &c.train.lr; }, 0, true));
    t.push_back(int_key(
        "train", "warmup_steps", [](Config& c) { return &c.train.warmup_steps; }, 0));
    t.push_back(float_key(
        "train", "weight_decay", [](Config& c) { return &c.train.weight_decay; }, 0, false));
    t.push_back(float_key(
        "train", "grad_clip", [](Config& c) { return &c.train.grad_clip; }, 0, false));
    t.push_back(float_key(
        "train", "min_lr_ratio", [](Config& c) { return &c.train.min_lr_ratio; }, 0, false, 1,
        false));
    t.push_back(float_key(
        "train", "beta1", [](Config& c) { return &c.train.beta1; }, 0, false, 1, true));
    t.push_back(float_key(
        "train", "beta2", [](Config& c) { return &c.train.beta2; }, 0, false, 1, true));
    t.push_back(float_key(
        "train", "eps", [](Config& c) { return &c.train.eps; }, 0, true));
    t.push_back(choice_key("train", "on_nonfinite",
                           [](Config & c) -> auto& { return c.train.on_nonfinite; },
                           {"stop", "skip"}));
    t.push_back(int_key(
        "train", "max_skipped_steps", [](Config& c) { return &c.train.max_skipped_steps; }, 1));
    t.push_back(float_key(
        "train", "loss_spike_factor", [](Config& c) { return &c.train.loss_spike_factor; }, 0,
        false));
    t.push_back(choice_key("train", "precision",
                           [](Config & c) -> auto& { return c.train.precision; },
                           {"fp32", "bf16"}));
    t.push_back(choice_key("train", "recompute",
                           [](Config & c) -> auto& { return c.train.recompute; },
                           {"none", "selective", "full"}));
    t.push_back(int_key(
        "train", "recompute_layers", [](Config& c) { return &c.train.recompute_layers; }, 0));
    t.push_back(choice_key("train", "optimizer_sharding",
                           [](Config & c) -> auto& { return c.train.optimizer_sharding; },
                           {"none", "dp"}));
    t.push_back(float_key(
        "train", "grad_bucket_mb", [](Config& c) { return &c.train.grad_bucket_mb; }, 0, false));
    t.push_back({"train", "tf32", Kind::Bool, [](Config& c) { return &c.train.tf32; }});
    // [eval]
    t.push_back(int_key(
        "eval", "every", [](Config& c) { return &c.eval.every; }, 0));
    t.push_back(int_key(
        "eval", "steps", [](Config& c) { return &c.eval.steps; }, 1));
    t.push_back(string_key(
        "eval", "token_file", [](Config& c) { return &c.eval.token_file; }, false));
    t.push_back(string_key(
        "eval", "prefix", [](Config& c) { return &c.eval.prefix; }, false));
    // [runtime]
    t.push_back(choice_key("runtime", "backend",
                           [](Config & c) -> auto& { return c.runtime.backend; },
                           {"cpu", "cuda", "auto", "emulated"}));
    t.push_back(choice_key("runtime", "comm", [](Config & c) -> auto& { return c.runtime.comm; },
                           {"mpi", "nccl", "auto"}));
    t.push_back(float_key(
        "runtime", "timeout_s", [](Config& c) { return &c.runtime.timeout_s; }, 0, true));
    t.push_back(choice_key("runtime", "ep_transport",
                           [](Config & c) -> auto& { return c.runtime.ep_transport; },
                           {"alltoallv", "shm", "auto"}));
    t.push_back(float_key(
        "runtime", "ep_shm_limit_mb", [](Config& c) { return &c.runtime.ep_shm_limit_mb; }, 0,
        false));
    t.push_back(
        {"runtime", "ep_overlap", Kind::Bool, [](Config& c) { return &c.runtime.ep_overlap; }});
    t.push_back(int_key(
        "runtime", "verify_every", [](Config& c) { return &c.runtime.verify_every; }, 0));
    t.push_back(float_key(
        "runtime", "straggler_threshold", [](Config& c) { return &c.runtime.straggler_threshold; },
        1, true));
    t.push_back(int_key(
        "runtime", "flight_records", [](Config& c) { return &c.runtime.flight_records; }, 0,
        1 << 20));
    // [output]
    t.push_back(string_key(
        "output", "file", [](Config& c) { return &c.output.file; }, true));
    t.push_back(int_key(
        "output", "checkpoint_every", [](Config& c) { return &c.output.checkpoint_every; }, 0));
    t.push_back(string_key(
        "output", "checkpoint_dir", [](Config& c) { return &c.output.checkpoint_dir; }, true));
    t.push_back(choice_key("output", "checkpoint_format",
                           [](Config & c) -> auto& { return c.output.checkpoint_format; },
                           {"sharded", "single"}));
    t.push_back({"output", "checkpoint_async", Kind::Bool,
                 [](Config& c) { return &c.output.checkpoint_async; }});
    t.push_back(int_key(
        "output", "checkpoint_staging_mb",
        [](Config& c) { return &c.output.checkpoint_staging_mb; }, 1));
    t.push_back(int_key(
        "output", "keep_checkpoints", [](Config& c) { return &c.output.keep_checkpoints; }, 0));
    t.push_back(string_key(
        "output", "local_checkpoint_dir", [](Config& c) { return &c.output.local_checkpoint_dir; },
        false));
    t.push_back(int_key(
        "output", "local_checkpoint_every",
        [](Config& c) { return &c.output.local_checkpoint_every; }, 0));
    for (const char* list : {"activation_steps", "activation_layers", "activation_samples"}) {
      std::string n = list;
      KeyDef k{"output", list, Kind::IntList, [n](Config& c) -> void* {
                 if (n == "activation_steps") return &c.output.activation_steps;
                 if (n == "activation_layers") return &c.output.activation_layers;
                 return &c.output.activation_samples;
               }};
      k.lo = 0;
      k.unique = true;
      t.push_back(k);
    }
    {
      KeyDef k{"output", "activations", Kind::StringList,
               [](Config& c) { return &c.output.activations; }};
      k.choices = {"q", "k", "v", "attn_out", "router_logits"};
      k.unique = true;
      t.push_back(k);
    }
    t.push_back({"output", "timeline", Kind::Bool, [](Config& c) { return &c.output.timeline; }});
    t.push_back(int_key(
        "output", "rank_stats_every", [](Config& c) { return &c.output.rank_stats_every; }, 0));
    // [topology]
    t.push_back(int_key(
        "topology", "nodes", [](Config& c) { return &topo_of(c).nodes; }, 1));
    t.push_back(int_key(
        "topology", "devices_per_node", [](Config& c) { return &topo_of(c).devices_per_node; }, 1));
    t.push_back(int_key(
        "topology", "nvlink_domain", [](Config& c) { return &topo_of(c).nvlink_domain; }, 0));
    return t;
  }();
  return table;
}

const KeyDef* find_key(const std::string& section, const std::string& name) {
  for (const auto& k : key_table())
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The known key nearest to section.name: a typo in the name, or the right
// name in the wrong table. Empty if nothing is close.
std::string suggest_key(const std::string& section, const std::string& name) {
  const std::string given = section + "." + name;
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : key_table()) {
    size_t d = edit_distance(given, k.full());
    if (k.section != section) d = std::min(d, edit_distance(name, k.name) + 1);
    if (d < best_d) {
      best_d = d;
      best = k.full();
    }
  }
  const size_t limit = std::max<size_t>(2, name.size() / 3);
  return best_d <= limit ? best : std::string();
}

std::string suggest_section(const std::string& name) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& s : kSections) {
    size_t d = edit_distance(name, s);
    if (d < best_d) {
      best_d = d;
      best = s;
    }
  }
  return best_d <= std::max<size_t>(2, name.size() / 3) ? best : std::string();
}

// One line, whatever the TOML library's message held.
std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

[[noreturn]] void fail(const std::string& origin, const std::string& key, const std::string& rule) {
  // A --set origin already names the key.
  if (origin.rfind("--set ", 0) == 0) throw InputError(one_line(origin + ": " + rule));
  throw InputError(one_line(origin + ": " + key + ": " + rule));
}

std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back exactly
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int:
      return "an integer";
    case Kind::UInt64:
      return "a non-negative integer";
    case Kind::Float:
      return "a number";
    case Kind::Bool:
      return "a boolean (true or false)";
    case Kind::String:
      return "a string";
    case Kind::IntList:
      return "an array of integers";
    case Kind::StringList:
      return "an array of strings";
    case Kind::Blend:
      return "an array of [weight, path] pairs";
  }
  return "?";
}

std::string range_text(const KeyDef& k) {
  auto num = [&](double v) {
    return k.kind == Kind::Float ? format_double(v) : std::to_string(static_cast<long long>(v));
  };
  const bool has_lo = k.lo != -kInf, has_hi = k.hi != kInf;
  if (has_lo && has_hi)
    return std::string("in ") + (k.lo_open ? "(" : "[") + num(k.lo) + ", " + num(k.hi) +
           (k.hi_open ? ")" : "]");
  if (has_lo) return std::string(k.lo_open ? "> " : ">= ") + num(k.lo);
  if (has_hi) return std::string(k.hi_open ? "< " : "<= ") + num(k.hi);
  return "finite";
}

bool in_range(const KeyDef& k, double v) {
  if (!std::isfinite(v)) return false;
  if (k.lo_open ? !(v > k.lo) : !(v >= k.lo)) return false;
  if (k.hi_open ? !(v < k.hi) : !(v <= k.hi)) return false;
  return true;
}

std::string choices_text(const KeyDef& k) {
  std::string s;
  for (size_t i = 0; i < k.choices.size(); ++i) s += (i ? ", " : "") + quote(k.choices[i]);
  return s;
}

bool is_choice(const KeyDef& k, const std::string& v) {
  return k.choices.empty() || std::find(k.choices.begin(), k.choices.end(), v) != k.choices.end();
}

// Reads a TOML integer into an int, checking the key's range.
long long checked_int(const KeyDef& k, const toml::node& n, const std::string& origin,
                      const std::string& what) {
  auto v = n.value_exact<int64_t>();
  if (!v) fail(origin, k.full(), "expected " + what + ", got " + type_name(n));
  if (!in_range(k, static_cast<double>(*v)))
    fail(origin, k.full(), "must be " + range_text(k) + " (got " + std::to_string(*v) + ")");
  if (k.kind != Kind::UInt64 && (*v > INT_MAX || *v < INT_MIN))
    fail(origin, k.full(), "must fit a 32-bit integer (got " + std::to_string(*v) + ")");
  return *v;
}

std::vector<int> int_list(const KeyDef& k, const toml::node& n, const std::string& origin) {
  const toml::array* arr = n.as_array();
  if (!arr)
    fail(origin, k.full(), std::string("expected an array of integers, got ") + type_name(n));
  std::vector<int> out;
  for (const toml::node& e : *arr) {
    auto v = e.value_exact<int64_t>();
    if (!v)
      fail(origin, k.full(), std::string("expected an array of integers, found ") + type_name(e));
    if (!in_range(k, static_cast<double>(*v)) || *v > INT_MAX)
      fail(origin, k.full(),
           "every element must be " + range_text(k) + " (got " + std::to_string(*v) + ")");
    if (k.unique && std::find(out.begin(), out.end(), static_cast<int>(*v)) != out.end())
      fail(origin, k.full(), "element " + std::to_string(*v) + " is listed twice");
    out.push_back(static_cast<int>(*v));
  }
  return out;
}

std::vector<std::string> string_list(const KeyDef& k, const toml::node& n,
                                     const std::string& origin) {
  const toml::array* arr = n.as_array();
  if (!arr)
    fail(origin, k.full(), std::string("expected an array of strings, got ") + type_name(n));
  std::vector<std::string> out;
  for (const toml::node& e : *arr) {
    auto v = e.value_exact<std::string>();
    if (!v)
      fail(origin, k.full(), std::string("expected an array of strings, found ") + type_name(e));
    if (!is_choice(k, *v))
      fail(origin, k.full(),
           "every element must be one of " + choices_text(k) + " (got " + quote(*v) + ")");
    if (k.unique && std::find(out.begin(), out.end(), *v) != out.end())
      fail(origin, k.full(), "element " + quote(*v) + " is listed twice");
    out.push_back(*v);
  }
  return out;
}

// One element of data.blend: a [weight, path] pair, weight > 0, path non-empty.
DataConfig::BlendEntry blend_entry(const KeyDef& k, const toml::node& e,
                                   const std::string& origin) {
  const toml::array* pair = e.as_array();
  const bool two = pair && pair->size() == 2;
  const toml::node* w = two ? pair->get(0) : nullptr;
  const toml::node* p = two ? pair->get(1) : nullptr;
  std::optional<double> weight;
  if (w && w->is_floating_point()) weight = w->value_exact<double>();
  if (w && w->is_integer()) weight = static_cast<double>(*w->value_exact<int64_t>());
  if (!weight || !p || !p->is_string())
    fail(origin, k.full(), "every element must be a [weight, path] pair, e.g. [0.7, \"a\"]");
  if (!(std::isfinite(*weight) && *weight > 0))
    fail(origin, k.full(), "every weight must be > 0 (got " + format_double(*weight) + ")");
  const std::string path = *p->value_exact<std::string>();
  if (path.empty()) fail(origin, k.full(), "a path must not be empty");
  return {*weight, path};
}

// data.blend: [[weight, path], ...].
std::vector<DataConfig::BlendEntry> blend_list(const KeyDef& k, const toml::node& n,
                                               const std::string& origin) {
  const toml::array* arr = n.as_array();
  if (!arr)
    fail(origin, k.full(), std::string("expected ") + kind_name(k.kind) + ", got " + type_name(n));
  std::vector<DataConfig::BlendEntry> out;
  for (const toml::node& e : *arr) out.push_back(blend_entry(k, e, origin));
  return out;
}

double float_value(const KeyDef& k, const toml::node& n, const std::string& origin) {
  std::optional<double> v;
  if (n.is_floating_point())
    v = n.value_exact<double>();
  else if (n.is_integer())
    v = static_cast<double>(*n.value_exact<int64_t>());
  if (!v) fail(origin, k.full(), std::string("expected a number, got ") + type_name(n));
  if (!in_range(k, *v))
    fail(origin, k.full(), "must be " + range_text(k) + " (got " + format_double(*v) + ")");
  return *v;
}

bool bool_value(const KeyDef& k, const toml::node& n, const std::string& origin) {
  auto v = n.value_exact<bool>();
  if (!v) fail(origin, k.full(), std::string("expected true or false, got ") + type_name(n));
  return *v;
}

void apply_string(Config& cfg, const KeyDef& k, const toml::node& n, const std::string& origin) {
  auto v = n.value_exact<std::string>();
  if (!v) fail(origin, k.full(), std::string("expected a string, got ") + type_name(n));
  if (!is_choice(k, *v))
    fail(origin, k.full(), "must be one of " + choices_text(k) + " (got " + quote(*v) + ")");
  if (k.nonempty && v->empty()) fail(origin, k.full(), "must not be empty");
  if (k.set_choice)
    k.set_choice(cfg, *v);
  else
    *static_cast<std::string*>(k.ref(cfg)) = *v;
}

// Sets key k of cfg from TOML node n; origin names where n came from.
void apply(Config& cfg, const KeyDef& k, const toml::node& n, const std::string& origin) {
  void* field = k.ref(cfg);
  switch (k.kind) {
    case Kind::Int:
      *static_cast<int*>(field) = static_cast<int>(checked_int(k, n, origin, "an integer"));
      break;
    case Kind::UInt64:
      *static_cast<uint64_t*>(field) =
          static_cast<uint64_t>(checked_int(k, n, origin, "a non-negative integer"));
      break;
    case Kind::Float:
      *static_cast<double*>(field) = float_value(k, n, origin);
      break;
    case Kind::Bool:
      *static_cast<bool*>(field) = bool_value(k, n, origin);
      break;
    case Kind::String:
      apply_string(cfg, k, n, origin);
      break;
    case Kind::IntList:
      *static_cast<std::vector<int>*>(field) = int_list(k, n, origin);
      break;
    case Kind::StringList:
      *static_cast<std::vector<std::string>*>(field) = string_list(k, n, origin);
      break;
    case Kind::Blend:
      *static_cast<std::vector<DataConfig::BlendEntry>*>(field) = blend_list(k, n, origin);
      break;
  }
}

std::string where(const std::string& source, const toml::node& n) {
  const auto line = n.source().begin.line;
  return line ? source + ":" + std::to_string(line) : source;
}

// Entries of a table in file order (TOML++ keeps them sorted by name).
template <typename Table>
std::vector<std::pair<std::string, const toml::node*>> in_file_order(const Table& t) {
  std::vector<std::pair<std::string, const toml::node*>> out;
  for (const auto& [key, node] : t) out.emplace_back(std::string(key.str()), &node);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.second->source().begin.line < b.second->source().begin.line;
  });
  return out;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

void apply_override(Config& cfg, const std::string& text) {
  const std::string origin = "--set " + text;
  const size_t eq = text.find('=');
  if (eq == std::string::npos) fail(origin, "", "expected section.key=value");
  const std::string key = trim(text.substr(0, eq)), value = trim(text.substr(eq + 1));
  const size_t dot = key.find('.');
  if (dot == std::string::npos) {
    std::string hint;
    for (const auto& k : key_table())
      if (k.name == key) hint = "; did you mean '" + k.full() + "'?";
    fail(origin, key, "expected section.key=value" + hint);
  }
  const std::string section = key.substr(0, dot), name = key.substr(dot + 1);
  const KeyDef* k = find_key(section, name);
  if (!k) {
    std::string s = suggest_key(section, name);
    fail(origin, key,
         "unknown key '" + key + "'" + (s.empty() ? "" : "; did you mean '" + s + "'?"));
  }
  if (value.empty()) fail(origin, key, "missing value");
  toml::table parsed;
  bool ok = true;
  try {
    parsed = toml::parse("v = " + value, std::string_view("--set"));
  } catch (const toml::parse_error&) {
    ok = false;
  }
  const toml::node* node = ok ? parsed.get("v") : nullptr;
  // Bare strings are accepted (--set parallel.schedule=zb-h1): for a string key
  // anything that is not a quoted TOML string is taken literally.
  toml::value<std::string> bare(value);
  if (k->kind == Kind::String && (!node || !node->is_string())) node = &bare;
  if (!node)
    fail(origin, key, std::string("expected ") + kind_name(k->kind) + ", got '" + value + "'");
  apply(cfg, *k, *node, origin);
  cfg.key_origin[k->full()] = origin;
}

std::string s(long long v) { return std::to_string(v); }

}  // namespace

std::vector<std::string> config_keys() {
  std::vector<std::string> out;
  for (const auto& k : key_table()) out.push_back(k.full());
  return out;
}

namespace {

// An unknown top-level name: the table (or, for a key outside any table,
// the key) it was probably meant to be.
[[noreturn]] void unknown_section(const std::string& at, const std::string& section,
                                  const toml::node& node) {
  std::string sug = suggest_section(section);
  if (!node.is_table()) {
    // A key outside any table, e.g. `lr = 1` at the top: name its table.
    std::string k = suggest_key("", section);
    if (!k.empty()) sug = k;
  }
  fail(at, section,
       "unknown table or key '" + section + "'" +
           (sug.empty() ? "; tables are [model] [data] [parallel] [train] [eval] [runtime] "
                          "[output] [topology]"
                        : "; did you mean '" + sug + "'?"));
}

// One [section] of the file, key by key in file order.
void apply_section(Config& cfg, const std::string& section, const toml::node& node) {
  const std::string at = where(cfg.source, node);
  if (std::find(kSections.begin(), kSections.end(), section) == kSections.end())
    unknown_section(at, section, node);
  const toml::table* tbl = node.as_table();
  if (!tbl)
    fail(at, section, std::string("expected a table [") + section + "], got " + type_name(node));
  if (section == "topology") {
    cfg.topology.emplace();
    cfg.key_origin["topology"] = at;
  }
  for (const auto& [name, value] : in_file_order(*tbl)) {
    const std::string vat = where(cfg.source, *value);
    const KeyDef* k = find_key(section, name);
    if (!k) {
      std::string sug = suggest_key(section, name);
      fail(vat, section + "." + name,
           "unknown key" + (sug.empty() ? std::string() : "; did you mean '" + sug + "'?"));
    }
    apply(cfg, *k, *value, vat);
    cfg.key_origin[k->full()] = vat;
  }
}

// [topology] replaces detection, so it must say what the cluster is.
void check_topology_given(Config& cfg) {
  const std::string at = cfg.key_origin.count("topology") ? cfg.key_origin["topology"] : cfg.source;
  if (cfg.topology->nodes <= 0)
    fail(at, "topology.nodes", "required when [topology] is given (>= 1)");
  if (cfg.topology->devices_per_node <= 0)
    fail(at, "topology.devices_per_node", "required when [topology] is given (>= 1)");
}

}  // namespace

Config parse_config_text(const std::string& toml_text, const std::string& source_name,
                         const std::vector<std::string>& overrides) {
  Config cfg;
  cfg.source = source_name.empty() ? "<defaults>" : source_name;
  toml::table root;
  try {
    root = toml::parse(toml_text, std::string_view(cfg.source));
  } catch (const toml::parse_error& e) {
    const auto line = e.source().begin.line;
    throw InputError(one_line(cfg.source + (line ? ":" + std::to_string(line) : std::string()) +
                              ": TOML syntax error: " + std::string(e.description())));
  }
  for (const auto& [section, node] : in_file_order(root)) apply_section(cfg, section, *node);
  for (const auto& o : overrides) apply_override(cfg, o);
  if (cfg.topology) check_topology_given(cfg);
  return cfg;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::string text;
  if (!path.empty()) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) throw InputError(path + ": cannot open the config file");
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    const bool bad = std::ferror(f);
    std::fclose(f);
    if (bad) throw InputError(path + ": cannot read the config file");
  }
  Config cfg = parse_config_text(text, path, overrides);
  validate_config(cfg, 0);
  return cfg;
}

void config_rule_failed(const Config& cfg, std::initializer_list<const char*> keys,
                        const std::string& rule) {
  // The rule text names every key involved, so pointing at the first one that
  // was given explicitly is clear whichever it is.
  for (const char* k : keys) {
    auto it = cfg.key_origin.find(k);
    if (it != cfg.key_origin.end()) fail(it->second, k, rule);
  }
  fail(cfg.source, *keys.begin(), rule);
}

namespace {

using RuleFailed = std::function<void(std::initializer_list<const char*>, const std::string&)>;

RuleFailed rule_failed(const Config& cfg) {
  return [&cfg](std::initializer_list<const char*> keys, const std::string& rule) {
    config_rule_failed(cfg, keys, rule);
  };
}

void check_model_layers(const Config& cfg, const RuleFailed& failed);

void check_model(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const RuleFailed failed = rule_failed(cfg);
  if (m.n_kv_heads > m.n_heads || m.n_heads % m.n_kv_heads != 0)
    failed({"model.n_kv_heads", "model.n_heads"},
           "model.n_heads=" + s(m.n_heads) + " must be a multiple of model.n_kv_heads=" +
               s(m.n_kv_heads) + " (grouped-query attention)");
  if (m.head_dim_key == 0 && m.d_model % m.n_heads != 0)
    failed({"model.d_model", "model.n_heads"},
           "model.d_model=" + s(m.d_model) + " must be divisible by model.n_heads=" + s(m.n_heads));
  if (m.head_dim_key == 0 && m.head_dim() % 2 != 0)
    failed({"model.d_model", "model.n_heads"},
           "head_dim = model.d_model/model.n_heads = " + s(m.head_dim()) +
               " must be even (RoPE rotates pairs)");
  if (m.head_dim_key % 2 != 0)
    failed({"model.head_dim"},
           "model.head_dim=" + s(m.head_dim_key) + " must be even (RoPE rotates pairs)");
  check_model_layers(cfg, rule_failed(cfg));
}

// The rules of a model's layers: dense layers, RoPE scaling, tied
// embeddings on a pipeline, experts.
void check_model_layers(const Config& cfg, const RuleFailed& failed) {
  const ModelConfig& m = cfg.model;
  // The embedding lives on the first virtual stage and the head on the last:
  // one parameter can serve both only where one rank holds both stages.
  for (int l : m.dense_layers)
    if (l >= m.n_layers)
      failed({"model.dense_layers", "model.n_layers"},
             "layer " + s(l) + " is outside [0, model.n_layers=" + s(m.n_layers) + ")");
  if (m.rope_scaling == RopeScaling::llama3 && !(m.rope_high_freq_factor > m.rope_low_freq_factor))
    failed({"model.rope_high_freq_factor", "model.rope_low_freq_factor"},
           "model.rope_high_freq_factor=" + format_double(m.rope_high_freq_factor) +
               " must be > model.rope_low_freq_factor=" + format_double(m.rope_low_freq_factor) +
               " (llama3 scaling interpolates between them)");
  const bool v_placement = cfg.parallel.schedule == PipelineSchedule::zb_v ||
                           cfg.parallel.schedule == PipelineSchedule::dualpipev;
  if (m.tie_embeddings && cfg.parallel.pp > 1 && !v_placement)
    failed({"model.tie_embeddings", "parallel.pp", "parallel.schedule"},
           "model.tie_embeddings = true needs the embedding and the LM head on one rank: "
           "parallel.pp = 1, or a V schedule (zb-v, dualpipev) that puts the first and the last "
           "stage on rank 0 (got parallel.pp=" +
               s(cfg.parallel.pp) + ", parallel.schedule=\"" + config_name(cfg.parallel.schedule) +
               "\")");
  if (m.n_experts > 0 && m.top_k > m.n_experts)
    failed({"model.top_k", "model.n_experts"},
           "model.top_k=" + s(m.top_k) + " must be <= model.n_experts=" + s(m.n_experts));
  if (m.n_experts > 0 && m.moe_every > m.n_layers)
    failed({"model.moe_every", "model.n_layers"},
           "model.moe_every=" + s(m.moe_every) + " must be <= model.n_layers=" + s(m.n_layers) +
               " (otherwise no layer is an MoE layer)");
}

// Not a token task: the token-file keys are refused away from their
// defaults only, since to_toml() writes every key and its text (a
// checkpoint's config_toml, convert hf --config-out) parses.
void check_no_token_keys(const Config& cfg, const RuleFailed& failed) {
  const DataConfig& d = cfg.data;
  const DataConfig dd;
  const std::pair<const char*, bool> set[] = {{"data.format", d.format != dd.format},
                                              {"data.prefix", d.prefix != dd.prefix},
                                              {"data.blend", d.blend != dd.blend},
                                              {"data.eod_token", d.eod_token != dd.eod_token},
                                              {"data.split", d.split != dd.split},
                                              {"data.packing", d.packing != dd.packing},
                                              {"eval.every", cfg.eval.every != EvalConfig{}.every}};
  for (const auto& [k, away] : set)
    if (away)
      failed({k, "data.task"}, std::string(k) +
                                   " applies to token files: set data.task = "
                                   "\"tokens\" (got \"" +
                                   config_name(d.task) + "\")");
}

// Where the training tokens come from: one file (flat), one prefix
// (Megatron) or a blend, never two of them.
void check_token_source(const DataConfig& d, const RuleFailed& failed) {
  const bool megatron = d.format == DataFormat::megatron;
  if (megatron && !d.token_file.empty())
    failed({"data.token_file", "data.format"},
           "data.format = \"megatron\" reads data.prefix (PATH without .bin/.idx), not "
           "data.token_file");
  if (!megatron && !d.prefix.empty())
    failed({"data.prefix", "data.format"},
           "data.prefix names a Megatron dataset: set data.format = \"megatron\"");
  const bool one = megatron ? !d.prefix.empty() : !d.token_file.empty();
  const char* one_key = megatron ? "data.prefix" : "data.token_file";
  if (!d.blend.empty() && one)
    failed({"data.blend", one_key},
           std::string("data.blend replaces ") + one_key + ": give one or the other");
  if (d.blend.empty() && !one)
    failed({"data.task", one_key, "data.blend"},
           megatron ? "data.format = \"megatron\" needs data.prefix (PATH of PATH.bin and "
                      "PATH.idx) or data.blend"
                    : "data.task = \"tokens\" needs data.token_file (a flat binary file of token "
                      "ids) or data.blend");
}

// data.split's shares and the validation data [eval] reads.
void check_eval_data(const Config& cfg, const RuleFailed& failed) {
  const EvalConfig& e = cfg.eval;
  const bool megatron = cfg.data.format == DataFormat::megatron;
  std::array<double, 3> shares{};
  try {
    shares = data_split_shares(cfg.data.split);
  } catch (const InputError& err) {
    failed({"data.split"}, err.what());
  }
  if (!megatron && !e.prefix.empty())
    failed({"eval.prefix", "data.format"},
           "eval.prefix names a Megatron dataset: set data.format = \"megatron\" (or use "
           "eval.token_file)");
  if (megatron && !e.token_file.empty())
    failed({"eval.token_file", "data.format"},
           "eval.token_file is a flat file: with data.format = \"megatron\" use eval.prefix");
  if (e.every > 0 && e.uses_split() && shares[1] <= 0)
    failed({"eval.every", "data.split"},
           "eval.every needs validation data: a validation share in data.split (e.g. \"98,2\") "
           "or eval.token_file / eval.prefix");
}

// data.format, prefix, blend, eod_token, split, packing and [eval] together.
void check_token_data(const Config& cfg) {
  const DataConfig& d = cfg.data;
  const RuleFailed failed = rule_failed(cfg);
  if (d.task != DataTask::tokens) return check_no_token_keys(cfg, failed);
  check_token_source(d, failed);
  if (d.eod_token >= cfg.model.vocab_size)
    failed({"data.eod_token", "model.vocab_size"},
           "data.eod_token=" + s(d.eod_token) +
               " must be below model.vocab_size=" + s(cfg.model.vocab_size));
  if (d.format == DataFormat::megatron && d.eod_token >= 0)
    failed({"data.eod_token", "data.format"},
           "data.eod_token is for flat files: a Megatron dataset's .idx holds its document "
           "boundaries");
  check_eval_data(cfg, failed);
}

// The fast resume tier: both keys or neither, sharded shards, a directory.
void check_local_checkpoints(const Config& cfg) {
  const OutputConfig& o = cfg.output;
  if (o.local_checkpoint_dir.empty() && o.local_checkpoint_every == 0) return;
  if (o.local_checkpoint_dir.empty() || o.local_checkpoint_every == 0)
    config_rule_failed(cfg, {"output.local_checkpoint_dir", "output.local_checkpoint_every"},
                       "the local checkpoint tier needs both output.local_checkpoint_dir (a "
                       "node-local directory: /dev/shm, a local SSD) and "
                       "output.local_checkpoint_every (steps between local saves)");
  if (o.checkpoint_format != CheckpointFormat::sharded)
    config_rule_failed(cfg, {"output.local_checkpoint_dir", "output.checkpoint_format"},
                       "local checkpoints are shards: output.checkpoint_format must be "
                       "\"sharded\"");
  std::error_code ec;
  if (std::filesystem::exists(o.local_checkpoint_dir, ec) &&
      !std::filesystem::is_directory(o.local_checkpoint_dir, ec))
    config_rule_failed(
        cfg, {"output.local_checkpoint_dir"},
        "output.local_checkpoint_dir '" + o.local_checkpoint_dir + "' is a file, not a directory");
}

void check_data_and_output(const Config& cfg) {
  const DataConfig& d = cfg.data;
  auto failed = [&](std::initializer_list<const char*> keys, const std::string& rule) {
    config_rule_failed(cfg, keys, rule);
  };
  if (d.task != DataTask::tokens && !d.token_file.empty())
    failed({"data.token_file", "data.task"},
           "data.token_file is only read with data.task = \"tokens\" (got \"" +
               config_name(d.task) + "\")");
  check_token_data(cfg);
  for (int l : cfg.output.activation_layers)
    if (l >= cfg.model.n_layers)
      failed({"output.activation_layers", "model.n_layers"},
             "layer " + s(l) + " is outside [0, model.n_layers=" + s(cfg.model.n_layers) + ")");
  check_local_checkpoints(cfg);
  for (int st : cfg.output.activation_steps)
    if (st > cfg.train.steps)
      failed({"output.activation_steps", "train.steps"},
             "step " + s(st) + " is after the last step (train.steps=" + s(cfg.train.steps) + ")");
}

void check_topology(const Config& cfg, int world_size) {
  if (!cfg.topology) return;
  const TopologyOverride& t = *cfg.topology;
  if (t.nvlink_domain > 0 && t.devices_per_node % t.nvlink_domain != 0)
    config_rule_failed(cfg, {"topology.nvlink_domain", "topology.devices_per_node"},
                       "topology.nvlink_domain=" + s(t.nvlink_domain) +
                           " must divide topology.devices_per_node=" + s(t.devices_per_node));
  if (world_size > 0 && static_cast<long long>(t.nodes) * t.devices_per_node != world_size)
    config_rule_failed(cfg, {"topology.nodes", "topology.devices_per_node"},
                       "topology.nodes*topology.devices_per_node = " + s(t.nodes) + "*" +
                           s(t.devices_per_node) + " must equal the world size " + s(world_size));
}

// The mesh against the world: dp = world / (pp*cp) whole, and the global
// batch that output.activation_samples index.
void check_world(const Config& cfg, int world_size) {
  const ParallelConfig& p = cfg.parallel;
  const DataConfig& d = cfg.data;
  if (world_size % (p.pp * p.cp) != 0)
    config_rule_failed(cfg, {"parallel.pp", "parallel.cp"},
                       "world size " + s(world_size) +
                           " must be divisible by parallel.pp*parallel.cp = " + s(p.pp) + "*" +
                           s(p.cp) + " = " + s(static_cast<long long>(p.pp) * p.cp));
  const int dp = world_size / (p.pp * p.cp);
  const long long global_batch =
      static_cast<long long>(d.micro_batch_size) * d.num_microbatches * dp;
  for (int smp : cfg.output.activation_samples)
    if (smp >= global_batch)
      config_rule_failed(
          cfg, {"output.activation_samples", "data.micro_batch_size", "data.num_microbatches"},
          "sample " + s(smp) + " is outside the global batch [0, " + s(global_batch) +
              ") = data.micro_batch_size*data.num_microbatches*dp = " + s(d.micro_batch_size) +
              "*" + s(d.num_microbatches) + "*" + s(dp));
}

}  // namespace

void validate_config(const Config& cfg, int world_size) {
  check_model(cfg);
  check_data_and_output(cfg);
  check_topology(cfg, world_size);
  if (world_size > 0) check_world(cfg, world_size);
}

std::array<double, 3> data_split_shares(const std::string& split) {
  std::array<double, 3> out{0, 0, 0};
  size_t n = 0, at = 0;
  const std::string rule =
      "data.split: expected 2 or 3 comma-separated shares \"train,validation[,test]\" with a "
      "positive train share, e.g. \"98,2\" (got \"" +
      split + "\")";
  while (at <= split.size()) {
    size_t comma = split.find(',', at);
    if (comma == std::string::npos) comma = split.size();
    const std::string part = trim(split.substr(at, comma - at));
    double v = 0;
    const auto res = std::from_chars(part.data(), part.data() + part.size(), v);
    if (n == 3 || part.empty() || res.ec != std::errc() || res.ptr != part.data() + part.size() ||
        !std::isfinite(v) || v < 0)
      throw InputError(rule);
    out[n++] = v;
    at = comma + 1;
  }
  if (n < 2 || out[0] <= 0) throw InputError(rule);
  return out;
}

namespace {

// A TOML array of items, each written by `item`.
template <typename T, typename Item>
void toml_array(std::ostream& out, const std::vector<T>& v, Item item) {
  out << "[";
  for (size_t i = 0; i < v.size(); ++i) {
    out << (i ? ", " : "");
    item(v[i]);
  }
  out << "]";
}

// Key k's value in c, as TOML.
void toml_value(std::ostream& out, const KeyDef& k, Config& c) {
  void* f = k.ref(c);
  switch (k.kind) {
    case Kind::Int:
      out << *static_cast<int*>(f);
      break;
    case Kind::UInt64:
      out << *static_cast<uint64_t*>(f);
      break;
    case Kind::Float:
      out << format_double(*static_cast<double*>(f));
      break;
    case Kind::Bool:
      out << (*static_cast<bool*>(f) ? "true" : "false");
      break;
    case Kind::String:
      out << quote(k.get_choice ? k.get_choice(c) : *static_cast<std::string*>(f));
      break;
    case Kind::IntList:
      toml_array(out, *static_cast<std::vector<int>*>(f), [&](int x) { out << x; });
      break;
    case Kind::StringList:
      toml_array(out, *static_cast<std::vector<std::string>*>(f),
                 [&](const std::string& x) { out << quote(x); });
      break;
    case Kind::Blend:
      toml_array(out, *static_cast<std::vector<DataConfig::BlendEntry>*>(f),
                 [&](const DataConfig::BlendEntry& x) {
                   out << "[" << format_double(x.weight) << ", " << quote(x.path) << "]";
                 });
      break;
  }
}

}  // namespace

std::string to_toml(const Config& cfg) {
  Config c = cfg;  // the field accessors take a mutable Config
  std::ostringstream out;
  out << "# trident resolved config (every key, defaults filled in)\n";
  std::string section;
  for (const auto& k : key_table()) {
    if (k.section == "topology" && !cfg.topology) continue;
    if (k.section != section) {
      out << (section.empty() ? "" : "\n") << "[" << k.section << "]\n";
      section = k.section;
    }
    out << k.name << " = ";
    toml_value(out, k, c);
    out << "\n";
  }
  return out.str();
}

std::string model_hash(const Config& cfg) {
  // FNV-1a over the [model] lines of to_toml(): stable across machines,
  // because the text (shortest round-trip doubles) is. The keys the first
  // checkpoints hashed always count; a key added since counts only when it
  // is set away from its default, so that a checkpoint written before the
  // key existed still names the same model (a new key's default keeps the
  // old behaviour).
  static const std::set<std::string> kFirstKeys = {
      "vocab_size",       "d_model",       "n_layers",   "n_heads",   "n_kv_heads",
      "ffn_hidden",       "n_experts",     "top_k",      "moe_every", "router",
      "capacity_factor",  "aux_loss_coef", "rope_theta", "norm_topk", "z_loss_coef",
      "router_bias_rate", "init_std"};
  auto model_lines = [](const Config& c) {
    const std::string text = to_toml(c);
    const size_t b = text.find("[model]\n");
    const size_t e = text.find("\n[", b + 1);
    std::istringstream in(text.substr(b, e == std::string::npos ? std::string::npos : e - b));
    std::vector<std::pair<std::string, std::string>> lines;  // (key, line)
    for (std::string line; std::getline(in, line);)
      lines.emplace_back(line.substr(0, line.find(" = ")), line);
    return lines;
  };
  std::map<std::string, std::string> defaults;
  for (auto& [key, line] : model_lines(Config{})) defaults[key] = line;
  std::string model;
  for (auto& [key, line] : model_lines(cfg)) {
    if (line != "[model]" && !kFirstKeys.count(key) && defaults[key] == line) continue;
    model += line + "\n";
  }
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : model) {
    h ^= ch;
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace trident
