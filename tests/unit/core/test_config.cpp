// Config: defaults, --set overrides, the TOML round trip, model_hash, and every
// per-key and cross-key rule (each with the file:line it must point at).
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>

#include "trident/core/config.hpp"
#include "trident/core/error.hpp"
#include "trident/parallel/pp/generators.hpp"
#include "trident/train/check_config.hpp"

using namespace trident;

namespace {

// The InputError message of f(), or "" if it did not throw one.
std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

std::string parse_error(const std::string& text, const std::vector<std::string>& sets = {}) {
  return input_error_of([&] { parse_config_text(text, "t.toml", sets); });
}

// Parses, then checks every layer's world-independent and world rules.
std::string validate_error(const std::string& text, int world,
                           const std::vector<std::string>& sets = {}) {
  return input_error_of(
      [&] { train::check_config(parse_config_text(text, "t.toml", sets), world); });
}

std::string source_dir() {
  const char* s = std::getenv("TRIDENT_SOURCE_DIR");
  return s ? s : TRIDENT_TEST_SOURCE_DIR;
}

}  // namespace

TEST_CASE("defaults are DESIGN.md's") {
  const Config c = parse_config_text("", "");
  CHECK(c.source == "<defaults>");
  CHECK(c.model.vocab_size == 64);
  CHECK(c.model.d_model == 64);
  CHECK(c.model.n_layers == 4);
  CHECK(c.model.n_heads == 4);
  CHECK(c.model.n_kv_heads == 4);
  CHECK(c.model.ffn_hidden == 128);
  CHECK(c.model.n_experts == 8);
  CHECK(c.model.top_k == 2);
  CHECK(c.model.moe_every == 1);
  CHECK(c.model.router == RouterScoring::softmax);
  CHECK(c.model.capacity_factor == 0.0);
  CHECK(c.model.aux_loss_coef == 0.01);
  CHECK(c.model.rope_theta == 10000.0);
  CHECK(c.data.task == DataTask::recall);
  CHECK(c.data.seq_len == 256);
  CHECK(c.data.micro_batch_size == 2);
  CHECK(c.data.num_microbatches == 4);
  CHECK(c.data.seed == 1234);
  CHECK(c.parallel.pp == 1);
  CHECK(c.parallel.vpp == 1);
  CHECK(c.parallel.cp == 1);
  CHECK(c.parallel.cp_layout == CpLayout::zigzag);
  CHECK(c.parallel.ep == 1);
  CHECK(c.parallel.schedule == PipelineSchedule::one_f_one_b);
  CHECK(c.train.steps == 100);
  CHECK(c.train.lr == 3e-3);
  CHECK(c.train.warmup_steps == 10);
  CHECK(c.train.weight_decay == 0.0);
  CHECK(c.train.grad_clip == 1.0);
  CHECK(c.runtime.backend == Backend::automatic);
  CHECK(c.runtime.comm == CommBackend::automatic);
  CHECK(c.runtime.timeout_s == 300);
  CHECK(c.runtime.flight_records == 256);
  CHECK(c.output.file == "trident-%j.h5");
  CHECK(c.output.checkpoint_every == 0);
  CHECK(c.output.checkpoint_dir == "checkpoints");
  CHECK(c.output.activation_steps.empty());
  CHECK(c.output.activation_layers == std::vector<int>{0});
  CHECK(c.output.activation_samples == std::vector<int>{0});
  CHECK(c.output.activations ==
        std::vector<std::string>{"q", "k", "v", "attn_out", "router_logits"});
  CHECK(c.output.timeline);
  CHECK_FALSE(c.topology.has_value());
  CHECK(c == Config{});
  // The defaults pass every rule for a single rank.
  CHECK(input_error_of([&] { train::check_config(c, 1); }).empty());
}

TEST_CASE("the quickstart example loads and validates for 8 ranks") {
  const Config c = load_config(source_dir() + "/share/trident/examples/quickstart.toml");
  CHECK(c.parallel.pp == 2);
  CHECK(c.parallel.cp == 2);
  CHECK(c.parallel.ep == 2);
  CHECK(c.model.n_kv_heads == 2);
  REQUIRE(c.topology.has_value());
  CHECK(c.topology->nodes == 2);
  CHECK(c.topology->devices_per_node == 4);
  CHECK(input_error_of([&] { train::check_config(c, 8); }).empty());
  // The key origins point at the file's lines.
  CHECK(c.key_origin.at("parallel.pp").find("quickstart.toml:") != std::string::npos);
}

TEST_CASE("every example config validates") {
  for (const char* name : {"quickstart.toml", "long-context.toml", "dense-pipeline.toml"}) {
    const std::string path = source_dir() + "/share/trident/examples/" + name;
    INFO(path);
    Config c;
    REQUIRE(input_error_of([&] { c = load_config(path); }).empty());
    // Examples for real clusters detect the topology; plan them with dp = 1.
    const int world = c.topology ? c.topology->nodes * c.topology->devices_per_node
                                 : c.parallel.pp * c.parallel.cp;
    CHECK(input_error_of([&] { train::check_config(c, world); }).empty());
  }
}

TEST_CASE("--set overrides parse their value as TOML") {
  const Config c = parse_config_text(
      "[train]\nlr = 0.5\n", "t.toml",
      {"train.lr=1e-3", "parallel.schedule=zb-h1", "output.activation_steps=[1,2]",
       "output.file=\"a b.h5\"", "model.norm_topk=false", "data.seed=77",
       " runtime.timeout_s = 12 ", "output.activations=[\"q\"]"});
  CHECK(c.train.lr == 1e-3);
  CHECK(c.parallel.schedule == PipelineSchedule::zb_h1);  // a bare string
  CHECK(c.output.activation_steps == std::vector<int>{1, 2});
  CHECK(c.output.file == "a b.h5");
  CHECK_FALSE(c.model.norm_topk);
  CHECK(c.data.seed == 77);
  CHECK(c.runtime.timeout_s == 12.0);
  CHECK(c.output.activations == std::vector<std::string>{"q"});
  CHECK(c.key_origin.at("train.lr") == "--set train.lr=1e-3");

  SECTION("a later --set wins") {
    const Config d = parse_config_text("", "t.toml", {"parallel.cp=2", "parallel.cp=4"});
    CHECK(d.parallel.cp == 4);
  }
  SECTION("a bare string that looks like a number is still a string for a string key") {
    const Config d = parse_config_text("", "t.toml", {"output.file=2024"});
    CHECK(d.output.file == "2024");
  }
  SECTION("a topology key creates the [topology] override") {
    const Config d =
        parse_config_text("", "t.toml", {"topology.nodes=2", "topology.devices_per_node=4"});
    REQUIRE(d.topology.has_value());
    CHECK(d.topology->nodes == 2);
    CHECK(d.topology->nvlink_domain == 0);
  }
}

TEST_CASE("--set errors name the override") {
  CHECK(parse_error("", {"train.lr"}) == "--set train.lr: expected section.key=value");
  CHECK(parse_error("", {"lr=3"}).find("did you mean 'train.lr'?") != std::string::npos);
  CHECK(parse_error("", {"train.lrr=3"}) ==
        "--set train.lrr=3: unknown key 'train.lrr'; did you mean 'train.lr'?");
  CHECK(parse_error("", {"train.lr=abc"}) == "--set train.lr=abc: expected a number, got 'abc'");
  CHECK(
      parse_error("", {"parallel.cp=two"}).rfind("--set parallel.cp=two: expected an integer", 0) ==
      0);
  CHECK(parse_error("", {"parallel.cp=0"}) == "--set parallel.cp=0: must be >= 1 (got 0)");
  CHECK(parse_error("", {"parallel.schedule=gpipe"}).find("must be one of \"afab\"") !=
        std::string::npos);
  CHECK(parse_error("", {"train.lr="}) == "--set train.lr=: missing value");
  // Cross-key errors caused by an override point at it.
  CHECK(validate_error("", 1, {"parallel.cp=3"}).rfind("--set parallel.cp=3: ", 0) == 0);
}

namespace {

// A config with every key changed from its default to another valid value,
// drawn from rng, including awkward strings and doubles.
Config random_config(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto real = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  Config c;
  c.model.vocab_size = pick(2, 100000);
  c.model.d_model = pick(1, 4096);
  c.model.n_layers = pick(1, 96);
  c.model.n_heads = pick(1, 64);
  c.model.n_kv_heads = pick(1, 64);
  c.model.ffn_hidden = pick(1, 16384);
  c.model.n_experts = pick(0, 256);
  c.model.top_k = pick(1, 8);
  c.model.moe_every = pick(1, 4);
  c.model.router = pick(0, 1) ? RouterScoring::softmax : RouterScoring::sigmoid_bias;
  c.model.capacity_factor = real(0, 4);
  c.model.aux_loss_coef = real(0, 1) * 1e-3;
  c.model.rope_theta = real(1, 1e7);
  c.model.norm_topk = pick(0, 1);
  c.model.z_loss_coef = real(0, 1e-2);
  c.model.router_bias_rate = 1e-3 / 3;
  c.model.init_std = real(1e-4, 1);
  c.model.window = pick(0, 1) ? 0 : pick(1, 1 << 20);
  c.model.head_dim_key = 2 * pick(0, 64);
  c.model.moe_ffn_hidden = pick(0, 4096);
  c.model.dense_layers = {pick(0, 3), pick(4, 7)};
  c.model.tie_embeddings = pick(0, 1);
  c.model.qk_norm = pick(0, 1);
  c.model.norm_eps = real(1e-8, 1e-4);
  c.model.rope_scaling = RopeScaling(pick(0, 2));
  c.model.rope_factor = real(1, 64);
  c.model.rope_low_freq_factor = real(0.5, 2);
  c.model.rope_high_freq_factor = real(2, 8);
  c.model.rope_original_max_positions = pick(1, 1 << 17);
  c.data.task = DataTask(pick(0, 2));
  c.data.seq_len = pick(1, 1 << 20);
  c.data.micro_batch_size = pick(1, 64);
  c.data.num_microbatches = pick(1, 64);
  c.data.seed = std::uniform_int_distribution<uint64_t>(0, (1ULL << 63) - 1)(rng);
  c.data.token_file = "dir with space/\"quoted\"\\tokens\t.bin";
  c.data.token_dtype = pick(0, 1) ? TokenDType::uint16 : TokenDType::uint32;
  c.data.format = pick(0, 1) ? DataFormat::flat : DataFormat::megatron;
  c.data.prefix = "data/name_text_document";
  c.data.eod_token = pick(-1, 50000);
  for (int i = pick(0, 3); i > 0; --i)
    c.data.blend.push_back({double(pick(1, 1000)) / 7.0, "set " + std::to_string(i)});
  c.data.split = std::to_string(pick(1, 99)) + "," + std::to_string(pick(0, 9));
  c.data.packing = pick(0, 1) ? Packing::none : Packing::documents;
  c.data.reset_positions = pick(0, 1);
  c.eval.every = pick(0, 1000);
  c.eval.steps = pick(1, 100);
  c.eval.token_file = "val.bin";
  c.eval.prefix = "val_text_document";
  c.parallel.pp = pick(1, 16);
  c.parallel.vpp = pick(1, 4);
  c.parallel.cp = pick(1, 16);
  c.parallel.cp_layout = pick(0, 1) ? CpLayout::zigzag : CpLayout::contiguous;
  c.parallel.ep = pick(1, 16);
  c.parallel.schedule = PipelineSchedule(pick(0, 5));
  c.parallel.cp_mode = CpMode(pick(0, 2));
  c.parallel.cp_ulysses = pick(0, 8);
  c.parallel.pp_layout = {pick(1, 8), pick(1, 8)};
  c.train.steps = pick(1, 100000);
  c.train.lr = real(1e-6, 1e-1);
  c.train.warmup_steps = pick(0, 1000);
  c.train.weight_decay = 0.1 + 0.2;  // not exactly 0.3
  c.train.grad_clip = real(0, 10);
  c.train.min_lr_ratio = real(0, 1);
  c.train.beta1 = real(0, 0.999);
  c.train.beta2 = real(0, 0.999);
  c.train.eps = 1e-300 * real(1, 2);
  c.train.precision = Precision(pick(0, 1));
  c.train.recompute = Recompute(pick(0, 2));
  c.train.recompute_layers = pick(0, 8);
  c.train.grad_bucket_mb = real(0, 64);
  c.train.tf32 = pick(0, 1) == 1;
  c.runtime.backend = Backend(pick(0, 2));
  c.runtime.comm = CommBackend(pick(0, 2));
  c.runtime.timeout_s = real(0.001, 1e5);
  c.output.file = "out-\u00e9t\u00e9-%j.h5";
  c.output.checkpoint_every = pick(0, 1000);
  c.output.checkpoint_dir = "ckpt/" + std::to_string(pick(0, 99));
  c.output.activation_steps = {pick(0, 9), pick(10, 19)};
  c.output.activation_layers = {};
  c.output.activation_samples = {pick(0, 4), pick(5, 9), pick(10, 14)};
  c.output.activations = {"router_logits", "q"};
  c.output.timeline = pick(0, 1);
  if (pick(0, 1)) c.topology = TopologyOverride{pick(1, 1024), pick(1, 16), pick(0, 16)};
  return c;
}

}  // namespace

TEST_CASE("to_toml round-trips every key") {
  std::mt19937 rng(20261129);
  for (int trial = 0; trial < 50; ++trial) {
    const Config c = random_config(rng);
    const std::string text = to_toml(c);
    INFO(text);
    const Config back = parse_config_text(text, "roundtrip.toml");
    CHECK(back == c);
    CHECK(to_toml(back) == text);
  }
  // The defaults too: data.task = "recall" with the token-file keys written
  // at their defaults (a checkpoint's config_toml, convert hf --config-out).
  CHECK(parse_config_text(to_toml(Config{}), "defaults.toml") == Config{});
  // Every key appears in the text, in its table.
  const std::string text = to_toml(random_config(rng));
  for (const std::string& key : config_keys()) {
    const std::string section = key.substr(0, key.find('.'));
    const std::string name = key.substr(key.find('.') + 1);
    if (section == "topology" && text.find("[topology]") == std::string::npos) continue;
    INFO(key);
    const size_t table = text.find("[" + section + "]");
    REQUIRE(table != std::string::npos);
    CHECK(text.find("\n" + name + " = ", table) != std::string::npos);
  }
  // The keys are DESIGN.md's plus the additions declared in config.hpp.
  const std::vector<std::string> expected = {"model.vocab_size",
                                             "model.d_model",
                                             "model.n_layers",
                                             "model.n_heads",
                                             "model.n_kv_heads",
                                             "model.ffn_hidden",
                                             "model.n_experts",
                                             "model.top_k",
                                             "model.moe_every",
                                             "model.router",
                                             "model.capacity_factor",
                                             "model.aux_loss_coef",
                                             "model.rope_theta",
                                             "model.norm_topk",
                                             "model.z_loss_coef",
                                             "model.router_bias_rate",
                                             "model.init_std",
                                             "model.window",
                                             "model.head_dim",
                                             "model.moe_ffn_hidden",
                                             "model.dense_layers",
                                             "model.tie_embeddings",
                                             "model.qk_norm",
                                             "model.norm_eps",
                                             "model.rope_scaling",
                                             "model.rope_factor",
                                             "model.rope_low_freq_factor",
                                             "model.rope_high_freq_factor",
                                             "model.rope_original_max_positions",
                                             "data.task",
                                             "data.seq_len",
                                             "data.micro_batch_size",
                                             "data.num_microbatches",
                                             "data.seed",
                                             "data.token_file",
                                             "data.token_dtype",
                                             "data.format",
                                             "data.prefix",
                                             "data.eod_token",
                                             "data.blend",
                                             "data.split",
                                             "data.packing",
                                             "data.reset_positions",
                                             "parallel.pp",
                                             "parallel.vpp",
                                             "parallel.cp",
                                             "parallel.cp_layout",
                                             "parallel.ep",
                                             "parallel.schedule",
                                             "parallel.cp_mode",
                                             "parallel.cp_ulysses",
                                             "parallel.pp_layout",
                                             "train.steps",
                                             "train.lr",
                                             "train.warmup_steps",
                                             "train.weight_decay",
                                             "train.grad_clip",
                                             "train.min_lr_ratio",
                                             "train.beta1",
                                             "train.beta2",
                                             "train.eps",
                                             "train.on_nonfinite",
                                             "train.max_skipped_steps",
                                             "train.loss_spike_factor",
                                             "train.precision",
                                             "train.recompute",
                                             "train.recompute_layers",
                                             "train.optimizer_sharding",
                                             "train.grad_bucket_mb",
                                             "train.tf32",
                                             "eval.every",
                                             "eval.steps",
                                             "eval.token_file",
                                             "eval.prefix",
                                             "runtime.backend",
                                             "runtime.comm",
                                             "runtime.timeout_s",
                                             "runtime.ep_transport",
                                             "runtime.ep_shm_limit_mb",
                                             "runtime.ep_overlap",
                                             "runtime.verify_every",
                                             "runtime.straggler_threshold",
                                             "runtime.flight_records",
                                             "output.file",
                                             "output.checkpoint_every",
                                             "output.checkpoint_dir",
                                             "output.checkpoint_format",
                                             "output.checkpoint_async",
                                             "output.checkpoint_staging_mb",
                                             "output.keep_checkpoints",
                                             "output.local_checkpoint_dir",
                                             "output.local_checkpoint_every",
                                             "output.activation_steps",
                                             "output.activation_layers",
                                             "output.activation_samples",
                                             "output.activations",
                                             "output.timeline",
                                             "output.rank_stats_every",
                                             "topology.nodes",
                                             "topology.devices_per_node",
                                             "topology.nvlink_domain"};
  CHECK(config_keys() == expected);
}

TEST_CASE("equality looks at every section") {
  Config a, b;
  b.output.timeline = false;
  CHECK_FALSE(a == b);
  b = a;
  b.topology = TopologyOverride{1, 1, 1};
  CHECK_FALSE(a == b);
  b = a;
  b.source = "elsewhere.toml";
  b.key_origin["model.d_model"] = "x:1";
  CHECK(a == b);  // where a value came from is not part of the config
}

TEST_CASE("model_hash covers exactly the [model] table") {
  const Config base;
  const std::string h = model_hash(base);
  REQUIRE(h.size() == 16);
  CHECK(h.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(model_hash(parse_config_text(to_toml(base), "x.toml")) == h);

  Config other = base;
  other.train.lr = 1.0;
  other.parallel.pp = 2;
  other.output.file = "elsewhere.h5";
  other.data.seed = 99;
  CHECK(model_hash(other) == h);  // a different run of the same model

  std::vector<std::function<void(Config&)>> model_changes = {
      [](Config& c) { c.model.vocab_size += 1; },
      [](Config& c) { c.model.d_model *= 2; },
      [](Config& c) { c.model.n_layers += 1; },
      [](Config& c) { c.model.n_kv_heads = 2; },
      [](Config& c) { c.model.n_experts = 0; },
      [](Config& c) { c.model.router = RouterScoring::sigmoid_bias; },
      [](Config& c) { c.model.rope_theta = 5e5; },
      [](Config& c) { c.model.init_std = 0.0200001; },
      [](Config& c) { c.model.window = 64; },
      [](Config& c) { c.model.norm_topk = false; },
      [](Config& c) { c.model.head_dim_key = 32; },
      [](Config& c) { c.model.moe_ffn_hidden = 64; },
      [](Config& c) { c.model.dense_layers = {0}; },
      [](Config& c) { c.model.tie_embeddings = true; },
      [](Config& c) { c.model.qk_norm = true; },
      [](Config& c) { c.model.norm_eps = 1e-6; },
      [](Config& c) { c.model.rope_scaling = RopeScaling::linear; },
      [](Config& c) { c.model.rope_factor = 8.0; }};
  for (size_t i = 0; i < model_changes.size(); ++i) {
    Config c = base;
    model_changes[i](c);
    INFO("change " << i);
    CHECK(model_hash(c) != h);
  }
}

TEST_CASE("model_hash of checkpoints written before a model key existed stays the same") {
  // The quickstart's hash as trident computed it when [model] had only its
  // first keys (the binary of 2026-12-01 19:21): a key added since counts
  // only when it is set away from its default, so those checkpoints load.
  const Config q = load_config(source_dir() + "/share/trident/examples/quickstart.toml");
  CHECK(model_hash(q) == "054236e196325f94");
  Config w = q;
  w.model.window = 8;
  CHECK(model_hash(w) != model_hash(q));
}

TEST_CASE("model_hash of a model without the pre-trained keys is the one format 2 wrote") {
  // FNV-1a 64 of the default model's [model] text before head_dim & co.
  // existed ("[model]\nvocab_size = 64\n..." through "init_std = 0.02\n"),
  // computed outside trident: an older checkpoint of it still matches.
  CHECK(model_hash(Config{}) == "5ae47f0229de8d9e");
}

TEST_CASE("min_microbatches per schedule") {
  for (int pp : {1, 2, 3, 8}) {
    CHECK(pp::min_microbatches("afab", pp, 1) == 1);
    CHECK(pp::min_microbatches("1f1b", pp, 1) == 1);
    CHECK(pp::min_microbatches("zb-h1", pp, 1) == 1);
    CHECK(pp::min_microbatches("interleaved", pp, 2) == 1);
    CHECK(pp::min_microbatches("zb-v", pp, 2) == 1);
    CHECK(pp::min_microbatches("dualpipev", pp, 2) == 2 * pp);
  }
  CHECK_THROWS_AS(parse_config_text("[parallel]\nschedule = \"gpipe\"\n", "t.toml"), InputError);
}

TEST_CASE("syntax, unknown keys and types are reported at their line") {
  CHECK(parse_error("[model]\nd_model = 64\nn_expert = 4\n") ==
        "t.toml:3: model.n_expert: unknown key; did you mean 'model.n_experts'?");
  CHECK(parse_error("[model]\nlr = 1e-3\n") ==
        "t.toml:2: model.lr: unknown key; did you mean 'train.lr'?");
  CHECK(parse_error("\n[modle]\nd_model = 4\n") ==
        "t.toml:2: modle: unknown table or key 'modle'; did you mean 'model'?");
  CHECK(parse_error("lr = 0.1\n")
            .find("t.toml:1: lr: unknown table or key 'lr'; did you mean 'train.lr'?") == 0);
  CHECK(parse_error("[model]\nwhatever_this_is = 4\n") ==
        "t.toml:2: model.whatever_this_is: unknown key");
  CHECK(parse_error("[model.sub]\nx = 1\n").find("model.sub: unknown key") != std::string::npos);
  CHECK(parse_error("model = 3\n") == "t.toml:1: model: expected a table [model], got an integer");
  CHECK(parse_error("[model\n").rfind("t.toml:1: TOML syntax error: ", 0) == 0);
  CHECK(
      parse_error("[model]\nd_model = 1\nd_model = 2\n").rfind("t.toml:3: TOML syntax error", 0) ==
      0);
  // The first problem in file order is the one reported, whatever the key order.
  CHECK(parse_error("[train]\nzzz = 1\naaa = 2\n").rfind("t.toml:2: train.zzz", 0) == 0);

  struct Case {
    std::string toml, message;
  };
  const std::vector<Case> cases = {
      {"[model]\nd_model = \"64\"", "t.toml:2: model.d_model: expected an integer, got a string"},
      {"[model]\nn_layers = 4.5", "t.toml:2: model.n_layers: expected an integer, got a float"},
      {"[train]\nlr = \"fast\"", "t.toml:2: train.lr: expected a number, got a string"},
      {"[output]\ntimeline = 1",
       "t.toml:2: output.timeline: expected true or false, got an integer"},
      {"[model]\nrouter = 1", "t.toml:2: model.router: expected a string, got an integer"},
      {"[output]\nactivation_steps = 3",
       "t.toml:2: output.activation_steps: expected an array of integers, got an integer"},
      {"[output]\nactivation_steps = [1, \"2\"]",
       "t.toml:2: output.activation_steps: expected an array of integers, found a string"},
      {"[output]\nactivations = [\"q\", 2]",
       "t.toml:2: output.activations: expected an array of strings, found an integer"},
      {"[data]\nseed = 1.5", "t.toml:2: data.seed: expected a non-negative integer, got a float"},
      {"[runtime]\ntimeout_s = true",
       "t.toml:2: runtime.timeout_s: expected a number, got a boolean"},
      {"[model]\nvocab_size = 5000000000",
       "t.toml:2: model.vocab_size: must fit a 32-bit integer (got 5000000000)"},
  };
  for (const auto& c : cases) {
    INFO(c.toml);
    CHECK(parse_error(c.toml) == c.message);
  }
  // A float key takes an integer.
  CHECK(parse_config_text("[train]\nlr = 1\n", "t").train.lr == 1.0);
}

TEST_CASE("per-key ranges and enums") {
  struct Case {
    std::string key, bad, rule;
    std::string good;
  };
  const std::vector<Case> cases = {
      {"model.vocab_size", "1", "must be >= 2", "2"},
      {"model.d_model", "0", "must be >= 1", "8"},
      {"model.n_layers", "0", "must be >= 1", "1"},
      {"model.n_heads", "-1", "must be >= 1", "1"},
      {"model.n_kv_heads", "0", "must be >= 1", "1"},
      {"model.ffn_hidden", "0", "must be >= 1", "1"},
      {"model.n_experts", "-1", "must be >= 0", "0"},
      {"model.top_k", "0", "must be >= 1", "1"},
      {"model.moe_every", "0", "must be >= 1", "2"},
      {"model.router", "\"topk\"", "must be one of \"softmax\", \"sigmoid_bias\"",
       "\"sigmoid_bias\""},
      {"model.capacity_factor", "-0.5", "must be >= 0.0", "1.25"},
      {"model.aux_loss_coef", "-1", "must be >= 0.0", "0"},
      {"model.rope_theta", "0", "must be > 0.0", "1e6"},
      {"model.z_loss_coef", "-1e-3", "must be >= 0.0", "1e-3"},
      {"model.router_bias_rate", "-1", "must be >= 0.0", "0"},
      {"model.init_std", "0.0", "must be > 0.0", "0.5"},
      {"model.window", "-1", "must be >= 0", "128"},
      {"data.task", "\"lm\"", "must be one of \"recall\", \"copy\", \"tokens\"", "\"copy\""},
      {"data.seq_len", "0", "must be >= 1", "2"},
      {"data.micro_batch_size", "0", "must be >= 1", "3"},
      {"data.num_microbatches", "0", "must be >= 1", "7"},
      {"data.seed", "-1", "must be >= 0", "0"},
      {"data.token_dtype", "\"int8\"", "must be one of \"uint16\", \"uint32\"", "\"uint32\""},
      {"data.format", "\"hf\"", "must be one of \"flat\", \"megatron\"", "\"megatron\""},
      {"data.packing", "\"docs\"", "must be one of \"none\", \"documents\"", "\"documents\""},
      {"data.eod_token", "-2", "must be >= -1", "0"},
      {"data.blend", "[[0, \"a\"]]", "every weight must be > 0", "[[0.5, \"a\"], [2, \"b\"]]"},
      {"data.blend", "[\"a\"]", "every element must be a [weight, path] pair", "[]"},
      {"data.blend", "[[1, \"\"]]", "a path must not be empty", "[[1, \"a\"]]"},
      {"eval.every", "-1", "must be >= 0", "0"},
      {"eval.steps", "0", "must be >= 1", "3"},
      {"parallel.pp", "0", "must be >= 1", "2"},
      {"parallel.vpp", "0", "must be >= 1", "1"},
      {"parallel.cp", "0", "must be >= 1", "2"},
      {"parallel.cp_layout", "\"ring\"", "must be one of \"zigzag\", \"contiguous\"",
       "\"contiguous\""},
      {"parallel.ep", "0", "must be >= 1", "2"},
      {"parallel.schedule", "\"gpipe\"",
       "must be one of \"afab\", \"1f1b\", \"interleaved\", \"zb-h1\"", "\"afab\""},
      {"train.steps", "0", "must be >= 1", "1"},
      {"train.lr", "0", "must be > 0.0", "1e-9"},
      {"train.lr", "-1e-3", "must be > 0.0", "1e-9"},
      {"train.lr", "nan", "must be > 0.0", "1e-9"},
      {"train.lr", "inf", "must be > 0.0", "1e-9"},
      {"train.warmup_steps", "-1", "must be >= 0", "0"},
      {"train.weight_decay", "-0.1", "must be >= 0.0", "0.1"},
      {"train.grad_clip", "-1", "must be >= 0.0", "0"},
      {"train.min_lr_ratio", "1.5", "must be in [0.0, 1.0]", "1.0"},
      {"train.beta1", "1.0", "must be in [0.0, 1.0)", "0.0"},
      {"train.beta2", "-0.1", "must be in [0.0, 1.0)", "0.999"},
      {"train.eps", "0", "must be > 0.0", "1e-12"},
      {"runtime.backend", "\"gpu\"", "must be one of \"cpu\", \"cuda\", \"auto\"", "\"cuda\""},
      {"runtime.comm", "\"gloo\"", "must be one of \"mpi\", \"nccl\", \"auto\"", "\"nccl\""},
      {"runtime.timeout_s", "0", "must be > 0.0", "0.5"},
      {"runtime.timeout_s", "-5", "must be > 0.0", "0.5"},
      {"runtime.flight_records", "-1", "must be in [0, 1048576]", "0"},
      {"runtime.flight_records", "1048577", "must be in [0, 1048576]", "1048576"},
      {"output.file", "\"\"", "must not be empty", "\"x.h5\""},
      {"output.checkpoint_every", "-1", "must be >= 0", "5"},
      {"output.checkpoint_dir", "\"\"", "must not be empty", "\"c\""},
      {"output.activation_steps", "[-1]", "every element must be >= 0", "[0, 3]"},
      {"output.activation_steps", "[2, 2]", "element 2 is listed twice", "[2]"},
      {"output.activation_layers", "[-2]", "every element must be >= 0", "[1]"},
      {"output.activation_samples", "[0, -1]", "every element must be >= 0", "[]"},
      {"output.activations", "[\"q\", \"attention\"]", "every element must be one of \"q\"",
       "[\"v\"]"},
      {"output.activations", "[\"q\", \"q\"]", "element \"q\" is listed twice", "[\"k\", \"q\"]"},
      {"topology.nodes", "0", "must be >= 1", "3"},
      {"topology.devices_per_node", "0", "must be >= 1", "4"},
      {"topology.nvlink_domain", "-1", "must be >= 0", "2"},
  };
  for (const auto& c : cases) {
    const std::string section = c.key.substr(0, c.key.find('.'));
    const std::string name = c.key.substr(c.key.find('.') + 1);
    // Topology needs its required keys; they come first so the bad one is line 4.
    std::string prefix = "# a comment\n[" + section + "]\n";
    if (section == "topology")
      prefix += std::string(name == "nodes" ? "devices_per_node = 4\n" : "nodes = 2\n");
    else
      prefix += "\n";
    INFO(c.key << " = " << c.bad);
    const std::string err = parse_error(prefix + name + " = " + c.bad + "\n");
    CHECK(err.rfind("t.toml:4: " + c.key + ": " + c.rule, 0) == 0);
    // The same rule through --set.
    const std::string set_err =
        parse_error(section == "topology" ? "[topology]\nnodes=2\ndevices_per_node=4\n" : "",
                    {c.key + "=" + c.bad});
    CHECK(set_err.rfind("--set " + c.key + "=" + c.bad + ": " + c.rule, 0) == 0);
    // And a good value is taken.
    const std::string rest = name == "nvlink_domain" ? "devices_per_node = 4\n" : "";
    CHECK(parse_error(prefix + name + " = " + c.good + "\n" + rest).empty());
  }
}

TEST_CASE("[topology] must name the cluster") {
  CHECK(parse_error("[topology]\nnvlink_domain = 4\n") ==
        "t.toml:1: topology.nodes: required when [topology] is given (>= 1)");
  CHECK(parse_error("[topology]\nnodes = 2\n") ==
        "t.toml:1: topology.devices_per_node: required when [topology] is given (>= 1)");
  CHECK(validate_error("[topology]\nnodes = 2\ndevices_per_node = 4\nnvlink_domain = 3\n", 0) ==
        "t.toml:4: topology.nvlink_domain: topology.nvlink_domain=3 must divide "
        "topology.devices_per_node=4");
  CHECK(validate_error("[topology]\nnodes = 2\ndevices_per_node = 4\n", 6)
            .rfind("t.toml:2: topology.nodes: topology.nodes*topology.devices_per_node = 2*4 must "
                   "equal the world size 6",
                   0) == 0);
  CHECK(validate_error("[topology]\nnodes = 2\ndevices_per_node = 4\n", 8).empty());
  CHECK(validate_error("[topology]\nnodes = 2\ndevices_per_node = 4\n", 0).empty());
}

TEST_CASE("cross-key rules") {
  struct Case {
    std::string toml;
    int world;
    std::string expect;  // the whole message, or its start when it ends in "..."
  };
  const std::vector<Case> cases = {
      {"[model]\nn_heads = 4\nn_kv_heads = 3\n", 0,
       "t.toml:3: model.n_kv_heads: model.n_heads=4 must be a multiple of model.n_kv_heads=3 "
       "(grouped-query attention)"},
      {"[model]\nn_heads = 4\nn_kv_heads = 8\n", 0,
       "t.toml:3: model.n_kv_heads: model.n_heads=4 must be a multiple of model.n_kv_heads=8 ..."},
      {"[model]\nd_model = 60\nn_heads = 8\nn_kv_heads = 8\n", 0,
       "t.toml:2: model.d_model: model.d_model=60 must be divisible by model.n_heads=8"},
      {"[model]\nd_model = 36\n", 0,
       "t.toml:2: model.d_model: head_dim = model.d_model/model.n_heads = 9 must be even (RoPE "
       "rotates pairs)"},
      {"[model]\nn_experts = 4\ntop_k = 6\n", 0,
       "t.toml:3: model.top_k: model.top_k=6 must be <= model.n_experts=4"},
      {"[model]\nn_experts = 6\n[parallel]\nep = 4\n", 0,
       "t.toml:4: parallel.ep: model.n_experts=6 must be divisible by parallel.ep=4"},
      {"[model]\nn_experts = 0\n[parallel]\nep = 2\n", 0,
       "t.toml:4: parallel.ep: parallel.ep=2 needs an MoE model (model.n_experts > 0)"},
      {"[model]\nn_layers = 2\nmoe_every = 3\n", 0,
       "t.toml:3: model.moe_every: model.moe_every=3 must be <= model.n_layers=2 ..."},
      {"[data]\nseq_len = 100\n[parallel]\ncp = 4\n", 0,
       "t.toml:2: data.seq_len: data.seq_len=100 must be divisible by 2*parallel.cp=8 (zigzag "
       "layout: 2*cp chunks)"},
      {"[parallel]\ncp = 3\n", 0,
       "t.toml:2: parallel.cp: data.seq_len=256 must be divisible by 2*parallel.cp=6 ..."},
      {"[data]\nseq_len = 100\n[parallel]\ncp = 8\ncp_layout = \"contiguous\"\n", 0,
       "t.toml:2: data.seq_len: data.seq_len=100 must be divisible by parallel.cp=8 (contiguous "
       "layout)"},
      {"[parallel]\nvpp = 2\n", 0,
       "t.toml:2: parallel.vpp: parallel.vpp=2 > 1 needs parallel.schedule = \"interleaved\" (got "
       "\"1f1b\"), or \"zb-v\" / \"dualpipev\" with parallel.vpp = 2"},
      {"[parallel]\nschedule = \"interleaved\"\n", 0,
       "t.toml:2: parallel.schedule: parallel.schedule = \"interleaved\" needs parallel.vpp >= 2 "
       "(got 1)"},
      {"[model]\nn_layers = 6\n[parallel]\npp = 4\n", 0,
       "t.toml:2: model.n_layers: model.n_layers=6 must be divisible by parallel.pp*parallel.vpp=4 "
       "..."},
      {"[model]\nn_layers = 8\n[parallel]\npp = 2\nvpp = 3\nschedule = \"interleaved\"\n", 0,
       "t.toml:2: model.n_layers: model.n_layers=8 must be divisible by parallel.pp*parallel.vpp=6 "
       "..."},
      {"[model]\nn_layers = 8\n[data]\nnum_microbatches = 6\n[parallel]\npp = 4\nvpp = 2\n"
       "schedule = \"dualpipev\"\n",
       0,
       "t.toml:4: data.num_microbatches: data.num_microbatches=6 must be >= 8 for schedule "
       "\"dualpipev\" with parallel.pp=4"},
      {"[model]\nn_layers = 8\n[parallel]\npp = 4\nschedule = \"zb-v\"\n", 0,
       "t.toml:5: parallel.schedule: parallel.schedule = \"zb-v\" holds two chunks per rank (V "
       "placement) and needs parallel.vpp = 2 (got 1)"},
      {"[data]\ntask = \"tokens\"\n", 0,
       "t.toml:2: data.task: data.task = \"tokens\" needs data.token_file (a flat binary file of "
       "token ids) or data.blend"},
      {"[data]\ntask = \"tokens\"\nformat = \"megatron\"\ntoken_file = \"a.bin\"\n", 0,
       "t.toml:4: data.token_file: data.format = \"megatron\" reads data.prefix (PATH without "
       ".bin/.idx), not data.token_file"},
      {"[data]\ntask = \"tokens\"\ntoken_file = \"a.bin\"\nblend = [[1, \"b.bin\"]]\n", 0,
       "t.toml:4: data.blend: data.blend replaces data.token_file: give one or the other"},
      {"[data]\ntask = \"tokens\"\ntoken_file = \"a.bin\"\neod_token = 64\n", 0,
       "t.toml:4: data.eod_token: data.eod_token=64 must be below model.vocab_size=64"},
      {"[data]\ntask = \"tokens\"\ntoken_file = \"a.bin\"\nsplit = \"98\"\n", 0,
       "t.toml:4: data.split: data.split: expected 2 or 3 comma-separated shares "
       "\"train,validation[,test]\" with a positive train share, e.g. \"98,2\" (got \"98\")"},
      {"[data]\ntask = \"tokens\"\ntoken_file = \"a.bin\"\n[eval]\nevery = 5\n", 0,
       "t.toml:5: eval.every: eval.every needs validation data: a validation share in data.split "
       "(e.g. \"98,2\") or eval.token_file / eval.prefix"},
      {"[data]\npacking = \"documents\"\n", 0,
       "t.toml:2: data.packing: data.packing applies to token files: set data.task = \"tokens\" "
       "(got \"recall\")"},
      {"[data]\ntoken_file = \"x.bin\"\n", 0,
       "t.toml:2: data.token_file: data.token_file is only read with data.task = \"tokens\" (got "
       "\"recall\")"},
      {"[output]\nactivation_layers = [0, 4]\n", 0,
       "t.toml:2: output.activation_layers: layer 4 is outside [0, model.n_layers=4)"},
      {"[train]\nsteps = 10\n[output]\nactivation_steps = [11]\n", 0,
       "t.toml:4: output.activation_steps: step 11 is after the last step (train.steps=10)"},
      {"[model]\nn_layers = 6\n[parallel]\npp = 3\n", 8,
       "t.toml:4: parallel.pp: world size 8 must be divisible by parallel.pp*parallel.cp = 3*1 = "
       "3"},
      {"[model]\nn_experts = 8\n[parallel]\npp = 2\nep = 8\n", 8,
       "t.toml:5: parallel.ep: parallel.ep=8 must divide dp*cp = 4*1 = 4 (the ranks of one "
       "pipeline stage; world size 8)"},
      {"[data]\nmicro_batch_size = 1\nnum_microbatches = 2\n[output]\nactivation_samples = [0, "
       "5]\n",
       2,
       "t.toml:5: output.activation_samples: sample 5 is outside the global batch [0, 4) = "
       "data.micro_batch_size*data.num_microbatches*dp = 1*2*2"},
  };
  for (const auto& c : cases) {
    INFO(c.toml);
    const std::string err = validate_error(c.toml, c.world);
    if (c.expect.size() > 3 && c.expect.substr(c.expect.size() - 3) == "...")
      CHECK(err.rfind(c.expect.substr(0, c.expect.size() - 3), 0) == 0);
    else
      CHECK(err == c.expect);
    // Each message is one line.
    CHECK(err.find('\n') == std::string::npos);
  }
}

TEST_CASE("cross-key rules pass at their boundaries") {
  // The edge of each rule is allowed, so the rules above are not too strict.
  const std::vector<std::pair<std::string, int>> ok = {
      {"[model]\nn_heads = 4\nn_kv_heads = 1\n", 0},
      {"[model]\nn_experts = 4\ntop_k = 4\n[parallel]\nep = 4\n", 4},
      {"[model]\nn_experts = 0\ntop_k = 7\n", 0},  // top_k unused by a dense model
      {"[data]\nseq_len = 8\n[parallel]\ncp = 4\n", 4},
      {"[data]\nseq_len = 12\n[parallel]\ncp = 12\ncp_layout = \"contiguous\"\n", 12},
      {"[model]\nn_layers = 8\n[data]\nnum_microbatches = 4\n[parallel]\npp = 4\nvpp = 2\n"
       "schedule = \"interleaved\"\n",
       4},
      {"[model]\nn_layers = 8\n[data]\nnum_microbatches = 1\n[parallel]\npp = 8\nschedule = "
       "\"zb-h1\"\n",
       8},
      // Interleaved takes any micro-batch count (its generator places the remainder).
      {"[model]\nn_layers = 8\n[data]\nnum_microbatches = 6\n[parallel]\npp = 4\nvpp = 2\n"
       "schedule = \"interleaved\"\n",
       4},
      {"[model]\nn_layers = 8\n[data]\nnum_microbatches = 2\n[parallel]\npp = 4\nvpp = 2\n"
       "schedule = \"interleaved\"\n",
       4},
      {"[model]\nn_layers = 8\n[data]\nnum_microbatches = 5\n[parallel]\npp = 4\nvpp = 2\n"
       "schedule = \"zb-v\"\n",
       4},
      {"[model]\nn_layers = 8\n[data]\nnum_microbatches = 8\n[parallel]\npp = 4\nvpp = 2\n"
       "schedule = \"dualpipev\"\n",
       4},
      {"[data]\ntask = \"tokens\"\ntoken_file = \"t.bin\"\n", 0},
      {"[output]\nactivation_layers = [3]\n", 0},
      {"[train]\nsteps = 10\n[output]\nactivation_steps = [0, 10]\n", 0},
      {"[data]\nmicro_batch_size = 1\nnum_microbatches = 2\n[output]\nactivation_samples = [3]\n",
       2},
      {"[model]\nn_experts = 8\n[parallel]\npp = 2\nep = 4\n", 8},
  };
  for (const auto& [toml, world] : ok) {
    INFO(toml);
    CHECK(validate_error(toml, world).empty());
  }
}

TEST_CASE("load_config reads files and applies the world-independent rules") {
  const std::string path = "test_config_tmp.toml";
  {
    std::ofstream f(path);
    f << "[model]\nn_experts = 4\ntop_k = 5\n";
  }
  CHECK(input_error_of([&] { load_config(path); }) ==
        "test_config_tmp.toml:3: model.top_k: model.top_k=5 must be <= model.n_experts=4");
  CHECK(load_config(path, {"model.top_k=2"}).model.top_k == 2);
  std::remove(path.c_str());
  CHECK(input_error_of([&] { load_config("does/not/exist.toml"); }) ==
        "does/not/exist.toml: cannot open the config file");
  CHECK(load_config("") == Config{});
}
