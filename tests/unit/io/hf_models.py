"""Small random Hugging Face models for trident's conversion tests, written
with numpy alone: a safetensors writer (the format's published layout), the
config.json of each architecture, and an independent float64 forward of
each architecture written from its published equations (Llama, Mixtral,
Qwen3-MoE as the transformers model cards and papers define them), not from
trident's code:

  x = E[tokens]
  per layer: x += Wo · attn(RoPE(qn(Wq · n1(x))), RoPE(kn(Wk · n1(x))), Wv · n1(x))
             x += FFN(n2(x))
  logits = W_head · n(x)           (W_head = E when the embeddings are tied)

n(x) = x / sqrt(mean(x²) + eps) * w; qn/kn: the same over each head (Qwen3),
identity otherwise. RoPE rotates the halves of each head: (a, b) -> (a cos -
b sin, a sin + b cos) at angle position * inv_freq[i], inv_freq[i] =
theta^(-2i/D), with "linear" dividing by factor and "llama3" applying Llama
3.1's wavelength bands. Attention is causal softmax(q kᵀ / sqrt(D)) v, query
head h reading key/value head h // (H / Hkv); a layer with a sliding window W
lets query i see keys j with i - W < j <= i (Mixtral's sliding_window on
every layer; Qwen3's with use_sliding_window on the layers from
max_window_layers on). A dense FFN is W_down (silu(W_gate
x) * (W_up x)); an MoE FFN takes softmax(W_router x), the top-k experts, and
sums their FFNs weighted by their probabilities (renormalised over the k
for Mixtral and for Qwen3 with norm_topk_prob).
"""
import json
import math
import os

import numpy as np

# ---- safetensors ----

DTYPES = {"F32": (np.float32, 4), "BF16": (np.uint16, 2), "F16": (np.float16, 2)}


def to_bf16_bits(a):
    """float32 -> bf16 bits, round to nearest even."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (dtype "F32"|"BF16", array); BF16 arrays are float32
    values rounded here. Data widest element first, header padded to 8."""
    items = []
    for name, (dt, arr) in tensors.items():
        if dt == "BF16":
            raw = to_bf16_bits(arr).tobytes()
        elif dt == "F32":
            raw = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        else:
            raw = np.ascontiguousarray(arr).tobytes()
        items.append((name, dt, list(np.shape(arr)), raw))
    items.sort(key=lambda t: -DTYPES.get(t[1], (None, 8))[1])
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in items:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for _, _, _, raw in items:
            f.write(raw)


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes), and the metadata."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    meta = header.pop("__metadata__", None)
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], data[b:end])
    return out, meta


def read_model_dir(d):
    """Every tensor of a model directory (sharded or not): name -> (dtype, shape, bytes)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx)
             else ["model.safetensors"])
    out = {}
    for fn in files:
        t, meta = read_safetensors(os.path.join(d, fn))
        assert meta == {"format": "pt"}, meta
        for k, v in t.items():
            assert k not in out, k
            out[k] = v
    return out


def as_f64(entry):
    dt, shape, raw = entry
    if dt == "F32":
        a = np.frombuffer(raw, dtype=np.float32)
    elif dt == "BF16":
        a = from_bf16_bits(np.frombuffer(raw, dtype=np.uint16))
    else:
        a = np.frombuffer(raw, dtype=np.float16)
    return a.astype(np.float64).reshape(shape)


def write_model(d, config, tensors, dtype="F32", shards=1):
    """config.json and the tensors (name -> float32 array) as one file or
    `shards` files with model.safetensors.index.json."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    names = list(tensors)
    if shards == 1:
        write_safetensors(os.path.join(d, "model.safetensors"),
                          {k: (dtype, tensors[k]) for k in names}, {"format": "pt"})
        return
    per = math.ceil(len(names) / shards)
    wm, total = {}, 0
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s * per:(s + 1) * per]
        write_safetensors(os.path.join(d, fn), {k: (dtype, tensors[k]) for k in part},
                          {"format": "pt"})
        for k in part:
            wm[k] = fn
            total += tensors[k].size * (4 if dtype == "F32" else 2)
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f)


# ---- the three architectures ----

def config_of(arch, tied=False, scaling="llama3"):
    base = dict(vocab_size=48, hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, hidden_act="silu",
                max_position_embeddings=512, initializer_range=0.02, rms_norm_eps=1e-5,
                use_cache=True, tie_word_embeddings=tied, attention_bias=False,
                attention_dropout=0.0, bos_token_id=1, eos_token_id=2, torch_dtype="float32",
                transformers_version="4.57.0")
    if arch == "llama":
        base.update(architectures=["LlamaForCausalLM"], model_type="llama", mlp_bias=False,
                    rope_theta=500000.0, pretraining_tp=1, head_dim=8)
        if scaling == "llama3":
            base["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 512}
        elif scaling == "linear":
            base["rope_scaling"] = {"type": "linear", "factor": 2.0}
        else:
            base["rope_scaling"] = None
    elif arch == "mixtral":
        base.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
                    router_jitter_noise=0.0, output_router_logits=False,
                    router_aux_loss_coef=0.02, rope_theta=1e6, rms_norm_eps=1e-6)
    elif arch == "qwen3_moe":
        base.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                    num_hidden_layers=4, head_dim=12, num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=16, decoder_sparse_step=1, mlp_only_layers=[1],
                    norm_topk_prob=False, use_sliding_window=False, sliding_window=4096,
                    max_window_layers=4, output_router_logits=False,
                    router_aux_loss_coef=0.001, rope_theta=1e6, rms_norm_eps=1e-6)
    return base


def window_of(c, layer):
    """The sliding window of a layer, or None (full causal attention)."""
    if c["model_type"] == "mixtral":
        return c.get("sliding_window")
    if c["model_type"] == "qwen3_moe" and c.get("use_sliding_window"):
        return c["sliding_window"] if layer >= c["max_window_layers"] else None
    return None


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def is_moe(c, layer):
    if c["model_type"] == "llama":
        return False
    if c["model_type"] == "mixtral":
        return True
    return (layer not in c["mlp_only_layers"] and c["num_experts"] > 0
            and (layer + 1) % c["decoder_sparse_step"] == 0)


def random_tensors(c, seed):
    """HF name -> float32 array; norm weights near 1, matrices ~ N(0, 0.3^2)."""
    rng = np.random.default_rng(seed)
    d, V, H, Hkv, D = (c["hidden_size"], c["vocab_size"], c["num_attention_heads"],
                       c["num_key_value_heads"], head_dim(c))
    f = c["intermediate_size"]

    def mat(*s):
        return (rng.standard_normal(s) * 0.3).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": mat(V, d)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = norm(d)
        t[p + "self_attn.q_proj.weight"] = mat(H * D, d)
        t[p + "self_attn.k_proj.weight"] = mat(Hkv * D, d)
        t[p + "self_attn.v_proj.weight"] = mat(Hkv * D, d)
        t[p + "self_attn.o_proj.weight"] = mat(d, H * D)
        if c["model_type"] == "qwen3_moe":
            t[p + "self_attn.q_norm.weight"] = norm(D)
            t[p + "self_attn.k_norm.weight"] = norm(D)
        t[p + "post_attention_layernorm.weight"] = norm(d)
        if not is_moe(c, l):
            t[p + "mlp.gate_proj.weight"] = mat(f, d)
            t[p + "mlp.up_proj.weight"] = mat(f, d)
            t[p + "mlp.down_proj.weight"] = mat(d, f)
        elif c["model_type"] == "mixtral":
            E = c["num_local_experts"]
            t[p + "block_sparse_moe.gate.weight"] = mat(E, d)
            for e in range(E):
                q = p + f"block_sparse_moe.experts.{e}."
                t[q + "w1.weight"] = mat(f, d)
                t[q + "w3.weight"] = mat(f, d)
                t[q + "w2.weight"] = mat(d, f)
        else:
            E, fe = c["num_experts"], c["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = mat(E, d)
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                t[q + "gate_proj.weight"] = mat(fe, d)
                t[q + "up_proj.weight"] = mat(fe, d)
                t[q + "down_proj.weight"] = mat(d, fe)
    t["model.norm.weight"] = norm(d)
    if not c["tie_word_embeddings"]:
        t["lm_head.weight"] = mat(V, d)
    return t


def inv_freq(c, D):
    rs = c.get("rope_scaling")
    base = c["rope_theta"] ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    if not rs:
        return base
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return base / rs["factor"]
    assert kind == "llama3"
    factor, lo, hi, old = (rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
                           rs["original_max_position_embeddings"])
    out = []
    for f in base:
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(f)
        elif wavelen > old / lo:
            out.append(f / factor)
        else:
            s = (old / wavelen - lo) / (hi - lo)
            out.append((1 - s) * f / factor + s * f)
    return np.array(out)


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, pos, freqs):
    """x [T, heads, D]: rotate the two halves of each head."""
    half = x.shape[-1] // 2
    ang = pos[:, None] * freqs[None, :]  # [T, half]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def silu(x):
    return x / (1 + np.exp(-x))


def forward(c, t, tokens):
    """Logits [T, V] of one sequence, float64."""
    g = {k: v.astype(np.float64) for k, v in t.items()}
    d, H, Hkv, D = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
                    head_dim(c))
    eps = c["rms_norm_eps"]
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    freqs = inv_freq(c, D)
    x = g["model.embed_tokens.weight"][tokens]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w = window_of(c, l)
        i, j = np.indices((T, T))
        mask = causal if w is None else causal & (i - j < w)
        h = rmsnorm(x, g[p + "input_layernorm.weight"], eps)
        q = (h @ g[p + "self_attn.q_proj.weight"].T).reshape(T, H, D)
        k = (h @ g[p + "self_attn.k_proj.weight"].T).reshape(T, Hkv, D)
        v = (h @ g[p + "self_attn.v_proj.weight"].T).reshape(T, Hkv, D)
        if c["model_type"] == "qwen3_moe":
            q = rmsnorm(q, g[p + "self_attn.q_norm.weight"], eps)
            k = rmsnorm(k, g[p + "self_attn.k_norm.weight"], eps)
        q, k = rope(q, pos, freqs), rope(k, pos, freqs)
        o = np.zeros((T, H, D))
        for hh in range(H):
            kv = hh // (H // Hkv)
            s = q[:, hh, :] @ k[:, kv, :].T / math.sqrt(D)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o[:, hh, :] = s @ v[:, kv, :]
        x = x + o.reshape(T, H * D) @ g[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, g[p + "post_attention_layernorm.weight"], eps)
        if not is_moe(c, l):
            y = (silu(h @ g[p + "mlp.gate_proj.weight"].T) * (h @ g[p + "mlp.up_proj.weight"].T)
                 ) @ g[p + "mlp.down_proj.weight"].T
        else:
            mix = c["model_type"] == "mixtral"
            pre = p + ("block_sparse_moe." if mix else "mlp.")
            names = ("w1", "w3", "w2") if mix else ("gate_proj", "up_proj", "down_proj")
            E = c["num_local_experts"] if mix else c["num_experts"]
            kk = c["num_experts_per_tok"]
            norm_k = True if mix else c["norm_topk_prob"]
            logits = h @ g[pre + "gate.weight"].T
            pr = np.exp(logits - logits.max(-1, keepdims=True))
            pr /= pr.sum(-1, keepdims=True)
            y = np.zeros_like(h)
            for i in range(T):
                top = np.argsort(-pr[i])[:kk]
                w = pr[i, top] / (pr[i, top].sum() if norm_k else 1.0)
                for e, we in zip(top, w):
                    q_ = pre + f"experts.{e}."
                    a = silu(h[i] @ g[q_ + names[0] + ".weight"].T) * (
                        h[i] @ g[q_ + names[1] + ".weight"].T)
                    y[i] += we * (a @ g[q_ + names[2] + ".weight"].T)
        x = x + y
    x = rmsnorm(x, g["model.norm.weight"], eps)
    head = g["model.embed_tokens.weight"] if c["tie_word_embeddings"] else g["lm_head.weight"]
    return x @ head.T
