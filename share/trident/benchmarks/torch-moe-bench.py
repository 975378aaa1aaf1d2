#!/usr/bin/env python3
"""The peer of cpu-efficiency.sh: the benchmark model of issue 28 trained in
PyTorch eager on the CPU, with one thread, so that trident's step can be
put next to PyTorch's on the same core (issue 28: "independent measurements
against PyTorch's eager training of the same model").

The model is the one the config describes, written with PyTorch's own ops:
token embedding; per layer x + attn(rmsnorm(x)) with RoPE on q and k and
causal grouped-query attention (scaled_dot_product_attention), then
x + moe(rmsnorm(x)): a softmax router, top-k weights renormalised, dropless
SwiGLU experts (tokens gathered per expert, results scattered back with
index_add_), the Switch load-balancing loss; final rmsnorm, LM head,
cross-entropy. Micro-batches accumulate gradients; then the global norm is
clipped and AdamW (beta 0.9 / 0.95, PyTorch's foreach implementation)
steps. Tokens are random (the throughput does not depend on the task, only
on the routing, which random tokens keep near uniform as trident's
synthetic task does at the start). The FLOPs per step are model_flops.py's,
as cpu-efficiency.sh's (3 x forward, causal pairs), so the two GFLOP/s
figures compare.

    OMP_NUM_THREADS=1 taskset -c 1 python3 torch-moe-bench.py [--config TOML] [--steps N] [--first F]
        [--precision fp32|bf16] [--bench-h5 FILE.h5]

--bench-h5 adds the run's row to the table torch_step of a trident bench file
(`trident bench step CONFIG --output FILE.h5`; bench_table.py), so that
`trident-analyze bench FILE.h5` prints it beside trident's step table.

A config with model.n_experts = 0 trains the dense model (a SwiGLU FFN in
every layer). --precision bf16 runs the forward under torch.autocast on the
CPU (bf16 GEMMs and SDPA through oneDNN where the CPU has bf16 units).

Prints one line per step and a summary: the median step time of steps
FIRST..STEPS-1, GFLOP/s, and torch.matmul's 2048^3 rate on the same thread
(best of 3) as PyTorch's own ceiling. Needs torch (see shared ENVIRONMENT
notes: the PyPI wheel with the CUDA stub libraries imports on a CPU host).
"""
import argparse
import math
import os
import statistics
import sys
import time
import tomllib

import torch
import torch.nn.functional as F

from model_flops import step_flops


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(S, hd, theta):
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(x, cos, sin):  # x [B, h, S, hd], pairs (2i, 2i+1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Model(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        d, f, E, V = m["d_model"], m["ffn_hidden"], m.get("n_experts", 8), m["vocab_size"]
        self.H, self.Hkv, self.k = m["n_heads"], m["n_kv_heads"], m.get("top_k", 2)
        self.hd = d // self.H
        self.aux_coef = m.get("aux_loss_coef", 0.01)
        self.theta = m.get("rope_theta", 10000.0)
        p = lambda *shape: torch.nn.Parameter(torch.randn(*shape) * 0.02)
        self.emb = p(V, d)
        self.layers = torch.nn.ModuleList()
        for _ in range(m["n_layers"]):
            L = torch.nn.Module()
            L.n1, L.n2 = torch.nn.Parameter(torch.ones(d)), torch.nn.Parameter(torch.ones(d))
            L.wq, L.wk = p(self.H * self.hd, d), p(self.Hkv * self.hd, d)
            L.wv, L.wo = p(self.Hkv * self.hd, d), p(d, self.H * self.hd)
            if E:
                L.router = p(E, d)
                L.gate, L.up, L.down = p(E, f, d), p(E, f, d), p(E, d, f)
            else:  # model.n_experts = 0: a dense SwiGLU FFN in every layer
                L.gate, L.up, L.down = p(f, d), p(f, d), p(d, f)
            self.layers.append(L)
        self.norm = torch.nn.Parameter(torch.ones(d))
        self.head = p(V, d)

    def moe(self, L, x):  # x [T, d]
        T, E = x.shape[0], L.router.shape[0]
        probs = torch.softmax(x @ L.router.t(), dim=-1)
        w, idx = probs.topk(self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        flat = idx.flatten()
        token = torch.arange(T).repeat_interleave(self.k)
        out = torch.zeros_like(x)
        for e in range(E):
            sel = (flat == e).nonzero().squeeze(1)
            if sel.numel() == 0:
                continue
            t = token[sel]
            xe = x[t]
            h = F.silu(xe @ L.gate[e].t()) * (xe @ L.up[e].t())
            out.index_add_(0, t, ((h @ L.down[e].t()) * w.flatten()[sel, None]).to(out.dtype))
        frac = torch.bincount(flat, minlength=E).float() / (T * self.k)
        aux = E * (frac * probs.mean(0)).sum()
        return out, aux

    def forward(self, tokens, targets):
        B, S = tokens.shape
        cos, sin = rope_tables(S, self.hd, self.theta)
        x = self.emb[tokens]
        aux = 0.0
        for L in self.layers:
            h = rms(x, L.n1)
            q = (h @ L.wq.t()).view(B, S, self.H, self.hd).transpose(1, 2)
            k = (h @ L.wk.t()).view(B, S, self.Hkv, self.hd).transpose(1, 2)
            v = (h @ L.wv.t()).view(B, S, self.Hkv, self.hd).transpose(1, 2)
            a = F.scaled_dot_product_attention(rope(q, cos, sin), rope(k, cos, sin), v,
                                               is_causal=True, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(B, S, -1) @ L.wo.t()
            if hasattr(L, "router"):
                y, a_l = self.moe(L, rms(x, L.n2).reshape(B * S, -1))
            else:
                h2 = rms(x, L.n2).reshape(B * S, -1)
                y, a_l = (F.silu(h2 @ L.gate.t()) * (h2 @ L.up.t())) @ L.down.t(), 0.0
            x = x + y.view(B, S, -1)
            aux = aux + a_l
        logits = rms(x, self.norm) @ self.head.t()
        ce = F.cross_entropy(logits.reshape(B * S, -1), targets.reshape(-1))
        return ce + self.aux_coef * aux


def matmul_gflops(n=2048):
    a, b = torch.rand(n, n), torch.rand(n, n)
    a @ b
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best / 1e9


def add_bench_row(args, flops, med, med_cpu, loss):
    """--bench-h5: this run's row in the table torch_step of a trident bench
    file (`trident bench step --output FILE.h5`; bench_table.py), with the
    columns of trident's step table, so that `trident-analyze bench` prints both."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_table import add_table
    path = f"torch {torch.__version__} eager" + (" autocast bf16" if args.precision == "bf16" else "")
    add_table(args.bench_h5, "torch_step",
              f"PyTorch eager training step of {os.path.basename(args.config)}, 1 thread "
              "(torch-moe-bench.py)",
              ["precision", "path", "steps", "cpu_s", "wall_s", "cpu_GFLOP/s", "wall_GFLOP/s",
               "loss_last"],
              [[args.precision, path, args.steps - args.first, med_cpu, med, flops / med_cpu / 1e9,
                flops / med / 1e9, loss]],
              [f"medians of steps {args.first}-{args.steps - 1}; FLOPs per step "
               f"{flops / 1e9:.2f} G (model_flops.py, the count of trident bench step); loss_last: "
               "on PyTorch's own random tokens and initialisation, not comparable to trident's"])


def main():
    here = __file__.rsplit("/", 1)[0]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=here + "/../examples/cpu-moe-bench.toml")
    ap.add_argument("--steps", type=int, default=13, help="steps to run (default 13)")
    ap.add_argument("--first", type=int, default=1, help="first step timed (default 1)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: the forward under torch.autocast('cpu', torch.bfloat16), "
                         "fp32 master weights (PyTorch's mixed precision on the CPU)")
    ap.add_argument("--bench-h5", help="add the run's row to this trident bench file (torch_step)")
    args = ap.parse_args()
    if not 0 <= args.first < args.steps:
        print("torch-moe-bench.py: --first must be in [0, --steps)", file=sys.stderr)
        return 2
    cfg = tomllib.load(open(args.config, "rb"))
    m, dat, tr = cfg["model"], cfg["data"], cfg.get("train", {})
    torch.set_num_threads(1)
    torch.manual_seed(dat.get("seed", 1234))
    model = Model(m)
    opt = torch.optim.AdamW(model.parameters(), lr=tr.get("lr", 3e-3), betas=(0.9, 0.95),
                            weight_decay=tr.get("weight_decay", 0.0), foreach=True)
    B, S, M, V = dat["micro_batch_size"], dat["seq_len"], dat["num_microbatches"], m["vocab_size"]
    times, cpu_times = [], []
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")
    for step in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=False)
        total = 0.0
        for _ in range(M):
            tok = torch.randint(0, V, (B, S + 1))
            with autocast:
                loss = model(tok[:, :-1], tok[:, 1:]) / M
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr.get("grad_clip", 1.0))
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        times.append(dt)
        cpu_times.append(dc)
        print(f"step {step:5d} | loss {total:.4f} | {dt:.3f} s | cpu {dc:.3f} s", flush=True)
    flops = step_flops(m, dat)
    med = statistics.median(times[args.first:])
    med_cpu = statistics.median(cpu_times[args.first:])
    ceil = matmul_gflops()
    print(f"torch {torch.__version__}, 1 thread, {args.precision}: median step {med:.3f} s, "
          f"cpu {med_cpu:.3f} s (steps {args.first}-"
          f"{args.steps - 1}), {flops / med / 1e9:.1f} GFLOP/s; torch.matmul 2048^3 {ceil:.1f} GFLOP/s; "
          f"ratio {flops / med / 1e9 / ceil:.3f}")
    if args.bench_h5:
        add_bench_row(args, flops, med, med_cpu, total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
