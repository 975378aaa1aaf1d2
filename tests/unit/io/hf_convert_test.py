"""trident convert hf / to-hf on small random models written with numpy
(hf_models.py): the round trip Hugging Face -> trident -> Hugging Face is
bit-exact for every tensor, in fp32 and bf16, from one file and from shards
to one file and to shards, for LlamaForCausalLM (llama3 and linear RoPE
scaling, tied embeddings), MixtralForCausalLM and Qwen3MoeForCausalLM (each
also with a sliding window on every layer); the
converted config keeps what the model computes; and bad inputs exit 2 with
one line naming the file, tensor or field, leaving no output behind.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_models as hm  # noqa: E402

BIN = os.environ["TRIDENT_BIN"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def trident(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def round_trip(tmp, name, config, dtype, shards_in, shard_out):
    src, ck, back = (os.path.join(tmp, name + s) for s in ("-hf", ".h5", "-back"))
    tensors = hm.random_tensors(config, seed=len(name))
    hm.write_model(src, config, tensors, dtype=dtype, shards=shards_in)
    r = trident("convert", "hf", src, "--out", ck, "--config-out", ck + ".toml")
    check(r.returncode == 0, f"{name}: convert hf exits 0 ({r.stderr.strip()})")
    if r.returncode:
        return
    args = ["convert", "to-hf", ck, "--out", back, "--dtype", "bf16" if dtype == "BF16" else "fp32"]
    if shard_out:
        args += ["--shard-size", "6000"]
    r = trident(*args)
    check(r.returncode == 0, f"{name}: convert to-hf exits 0 ({r.stderr.strip()})")
    if r.returncode:
        return
    a, b = hm.read_model_dir(src), hm.read_model_dir(back)
    check(sorted(a) == sorted(b), f"{name}: the same {len(a)} tensor names come back")
    same = all(a[k] == b.get(k) for k in a)
    check(same, f"{name}: every tensor's dtype, shape and bytes come back bit for bit")
    sharded = os.path.exists(os.path.join(back, "model.safetensors.index.json"))
    check(sharded == shard_out, f"{name}: sharded output {shard_out}")
    if shard_out:
        idx = json.load(open(os.path.join(back, "model.safetensors.index.json")))
        files = set(idx["weight_map"].values())
        check(len(files) > 1 and all(os.path.exists(os.path.join(back, f)) for f in files),
              f"{name}: {len(files)} shards named by the index exist")
        total = sum(len(v[2]) for v in b.values())
        check(idx["metadata"]["total_size"] == total, f"{name}: index total_size {total}")
    cb = json.load(open(os.path.join(back, "config.json")))
    for key in ("architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "tie_word_embeddings", "rms_norm_eps", "rope_theta", "num_local_experts",
                "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob"):
        if key in config:
            check(cb.get(key) == config[key], f"{name}: config.json {key} = {config[key]!r}")
    check(cb["head_dim"] == hm.head_dim(config), f"{name}: config.json head_dim")
    w = hm.window_of(config, config["num_hidden_layers"] - 1)
    check(cb.get("sliding_window") == w and
          cb.get("use_sliding_window", w is not None) == (w is not None) and
          cb.get("max_window_layers", 0) == 0,
          f"{name}: config.json sliding window {w} on every layer")
    rs = config.get("rope_scaling")
    if rs:
        kind = rs.get("rope_type", rs.get("type"))
        got = cb.get("rope_scaling") or {}
        check(got.get("rope_type") == kind and got.get("factor") == rs["factor"],
              f"{name}: rope_scaling {kind} x{rs['factor']} kept")
    # A second trip from the exported directory gives the same checkpoint.
    ck2 = os.path.join(tmp, name + "-2.h5")
    r = trident("convert", "hf", back, "--out", ck2)
    check(r.returncode == 0, f"{name}: the exported directory converts again ({r.stderr.strip()})")


def expect_refusal(tmp, name, build, needle):
    """build(dir) makes a bad model directory; convert hf must exit 2 with
    one line holding `needle`, and write no checkpoint."""
    d = os.path.join(tmp, "bad-" + name)
    build(d)
    out = os.path.join(tmp, "bad-" + name + ".h5")
    r = trident("convert", "hf", d, "--out", out, "--config-out", out + ".toml")
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and needle in lines[0],
          f"refused {name}: exit {r.returncode}, {lines!r} holds {needle!r}")
    check(not os.path.exists(out) and not os.path.exists(out + ".toml"),
          f"refused {name}: no checkpoint or config written")


def main():
    tmp = tempfile.mkdtemp(prefix="trident-hf-")
    try:
        cases = [("llama", hm.config_of("llama")),
                 ("llama-tied-linear", hm.config_of("llama", tied=True, scaling="linear")),
                 ("mixtral", hm.config_of("mixtral")),
                 ("qwen3moe", hm.config_of("qwen3_moe")),
                 ("mixtral-window", dict(hm.config_of("mixtral"), sliding_window=6)),
                 ("qwen3moe-window", dict(hm.config_of("qwen3_moe"), use_sliding_window=True,
                                          sliding_window=6, max_window_layers=0))]
        for name, cfg in cases:
            for dtype in ("F32", "BF16"):
                cfg = dict(cfg, torch_dtype="float32" if dtype == "F32" else "bfloat16")
                round_trip(tmp, f"{name}-{dtype}-1to1", cfg, dtype, 1, False)
                round_trip(tmp, f"{name}-{dtype}-3toN", cfg, dtype, 3, True)

        # The converted config: what trident computes for each architecture.
        toml = open(os.path.join(tmp, "qwen3moe-F32-1to1.h5.toml")).read()
        for line in ("head_dim = 12", "qk_norm = true", "moe_ffn_hidden = 16",
                     "dense_layers = [1]", "norm_topk = false", "norm_eps = 1e-06",
                     "n_experts = 4", "top_k = 2", "moe_every = 1", "rope_theta = 1e+06"):
            check(line in toml, f"qwen3moe config: {line}")
        toml = open(os.path.join(tmp, "llama-F32-1to1.h5.toml")).read()
        for line in ('rope_scaling = "llama3"', "rope_factor = 8.0",
                     "rope_original_max_positions = 512", "n_experts = 0", "head_dim = 0"):
            check(line in toml, f"llama config: {line}")
        for name in ("mixtral", "qwen3moe"):
            toml = open(os.path.join(tmp, f"{name}-F32-1to1.h5.toml")).read()
            check("window = 0" in toml, f"{name} config: window = 0")
            toml = open(os.path.join(tmp, f"{name}-window-F32-1to1.h5.toml")).read()
            check("window = 6" in toml, f"{name}-window config: window = 6")
        toml = open(os.path.join(tmp, "llama-tied-linear-F32-1to1.h5.toml")).read()
        check("tie_embeddings = true" in toml and 'rope_scaling = "linear"' in toml,
              "tied llama config: tie_embeddings, linear scaling")

        # ---- bad inputs ----
        good_cfg = hm.config_of("mixtral")
        good = hm.random_tensors(good_cfg, seed=7)

        def model_with(mutate_file=None, cfg=None, tensors=None, dtype="F32"):
            def build(d):
                hm.write_model(d, cfg or good_cfg, tensors or good, dtype=dtype)
                if mutate_file:
                    mutate_file(os.path.join(d, "model.safetensors"))
            return build

        def truncate(p):
            with open(p, "r+b") as f:
                f.truncate(os.path.getsize(p) - 10)

        def header_past_end(p):
            with open(p, "r+b") as f:
                f.write((os.path.getsize(p) + 100).to_bytes(8, "little"))

        def rewrite_header(p, change):
            blob = open(p, "rb").read()
            n = int.from_bytes(blob[:8], "little")
            h = json.loads(blob[8:8 + n])
            change(h)
            new = json.dumps(h).encode()
            new += b" " * ((8 - len(new) % 8) % 8)
            open(p, "wb").write(len(new).to_bytes(8, "little") + new + blob[8 + n:])

        def overlap(h):
            a, b = "model.norm.weight", "model.layers.0.input_layernorm.weight"
            h[b]["data_offsets"] = [h[a]["data_offsets"][0] + 4, h[a]["data_offsets"][1] + 4]

        def unaligned(h):
            # one tensor moved by two bytes and read as F32 still spans its bytes
            e = h["model.norm.weight"]
            e["data_offsets"] = [e["data_offsets"][0] + 2, e["data_offsets"][1] + 2]

        def dtype_i64(h):
            e = h["model.norm.weight"]
            e["dtype"] = "I64"
            e["shape"] = [e["shape"][0] // 2]

        expect_refusal(tmp, "truncated", model_with(truncate), "truncated file")
        expect_refusal(tmp, "header-length", model_with(header_past_end),
                       "runs past the end of the file")
        expect_refusal(tmp, "overlap", model_with(lambda p: rewrite_header(p, overlap)), "overlap")
        expect_refusal(tmp, "unaligned", model_with(lambda p: rewrite_header(p, unaligned)),
                       "not aligned")
        expect_refusal(tmp, "dtype", model_with(lambda p: rewrite_header(p, dtype_i64)),
                       'dtype "I64" is not supported')
        missing = dict(good)
        del missing["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
        expect_refusal(tmp, "missing", model_with(tensors=missing),
                       "missing tensor 'model.layers.1.block_sparse_moe.experts.3.w2.weight'")
        wrong = dict(good)
        wrong["model.layers.0.self_attn.k_proj.weight"] = np.zeros((8, 32), np.float32)
        expect_refusal(tmp, "shape", model_with(tensors=wrong),
                       "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 32], "
                       "config.json says [16, 32]")
        extra = dict(good)
        extra["model.layers.0.self_attn.q_proj.bias"] = np.zeros(32, np.float32)
        expect_refusal(tmp, "extra-tensor", model_with(tensors=extra),
                       "tensor 'model.layers.0.self_attn.q_proj.bias' has no place")
        for field, value, needle in (
                ("architectures", ["GPT2LMHeadModel"], "architectures"),
                ("attention_bias", True, "attention_bias"),
                ("sliding_window", 0, "sliding_window: must be >= 1 or null"),
                ("hidden_act", "gelu", "hidden_act"),
                ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling.rope_type"),
                ("some_new_field", 1, "some_new_field")):
            expect_refusal(tmp, "config-" + field,
                           model_with(cfg=dict(good_cfg, **{field: value})), needle)
        q = hm.config_of("qwen3_moe")
        # Qwen3: one window for every layer or none (per-layer windows refused).
        for name, change, needle in (
                ("qwen-window-layers", dict(use_sliding_window=True, max_window_layers=2),
                 "max_window_layers: 2 with use_sliding_window"),
                ("qwen-window-layers-missing", dict(use_sliding_window=True),
                 "max_window_layers: missing"),
                ("qwen-window-null", dict(use_sliding_window=True, sliding_window=None,
                                          max_window_layers=0), "sliding_window: missing")):
            qc = {k: v for k, v in dict(q, **change).items()
                  if not (name.endswith("missing") and k == "max_window_layers")}
            expect_refusal(tmp, name, lambda d, qc=qc: hm.write_model(
                d, qc, hm.random_tensors(q, 3)), needle)
        # Llama has no such field: unknown, refused.
        lc = dict(hm.config_of("llama"), sliding_window=8)
        expect_refusal(tmp, "llama-window", lambda d: hm.write_model(
            d, lc, hm.random_tensors(lc, 3)), "sliding_window: a field trident does not know")
        expect_refusal(tmp, "bad-json", lambda d: (model_with()(d), open(
            os.path.join(d, "config.json"), "w").write('{"vocab_size": 48,}')), "JSON")

        # to-hf refuses a model no architecture has, and writes nothing.
        cfg_path = os.path.join(tmp, "sig.toml")
        open(cfg_path, "w").write(open(os.path.join(tmp, "mixtral-F32-1to1.h5.toml")).read()
                                  .replace('router = "softmax"', 'router = "sigmoid_bias"'))
        # a checkpoint of that model: the converted one under another config is
        # another model, so build it by running one step
        r = subprocess.run([BIN, "run", cfg_path, "--set", "train.steps=1", "--set",
                            f"output.checkpoint_dir={tmp}/sig-ck", "--set",
                            "topology.nodes=1", "--set", "topology.devices_per_node=1",
                            "--set", "data.seq_len=16", "--output", f"{tmp}/sig.h5"],
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"a sigmoid_bias model trains one step ({r.stderr.strip()})")
        cks = sorted(os.listdir(f"{tmp}/sig-ck")) if os.path.isdir(f"{tmp}/sig-ck") else []
        if cks:
            out = os.path.join(tmp, "sig-hf")
            r = trident("convert", "to-hf", f"{tmp}/sig-ck/{cks[-1]}", "--out", out)
            lines = r.stderr.strip().splitlines()
            check(r.returncode == 2 and len(lines) == 1 and "model.router" in lines[0],
                  f"to-hf refuses sigmoid_bias: {lines!r}")
            check(not os.path.exists(out), "to-hf wrote nothing")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
