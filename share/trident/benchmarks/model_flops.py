"""FLOPs of one training step of a trident config (model and data tables of
its TOML): 3 x the forward's GEMM FLOPs (projections, router, experts' top-k
SwiGLU or the dense SwiGLU, LM head) plus the causal attention's pairs, the formula of `trident
plan`. Shared by cpu-efficiency.sh and torch-moe-bench.py so that trident's
and PyTorch's GFLOP/s count the same work."""


def step_flops(m, dat):
    d, L, H, Hkv = m["d_model"], m["n_layers"], m["n_heads"], m["n_kv_heads"]
    hd, S = d // H, dat["seq_len"]
    E = m.get("n_experts", 8)  # 0: a dense SwiGLU FFN (one "expert" per token)
    k = m.get("top_k", 2) if E else 1
    per_token = L * (2 * d * (2 * H * hd + 2 * Hkv * hd) + 2 * d * E
                     + 6.0 * k * d * m["ffn_hidden"]) + 2 * d * m["vocab_size"]
    seqs = dat["micro_batch_size"] * dat["num_microbatches"]
    return 3 * seqs * (S * per_token + L * (S * (S + 1) / 2) * 4 * H * hd)
