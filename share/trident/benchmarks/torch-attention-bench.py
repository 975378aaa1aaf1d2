#!/usr/bin/env python3
"""The peer of `trident bench attention`: PyTorch's scaled_dot_product_attention
on the CPU, one thread, forward and forward + backward, in fp32 and in bf16
(q, k, v bf16: oneDNN's bf16 kernels where the CPU has them), by CPU time
and by wall time (each the best of REPS after a warm-up; `trident bench
attention` reports the best wall time), with the FLOPs `trident bench attention`
counts (4 S^2 D per head forward, x 3.5 with the backward; half of it
causal), so the GFLOP/s compare.

    OMP_NUM_THREADS=1 taskset -c 1 python3 torch-attention-bench.py [--seq 2048] [--head-dim 128]
        [--heads 1] [--mask causal] [--reps 3] [--bench-h5 FILE.h5]

--bench-h5 adds the rows to the table torch_attention of a trident bench file
(`trident bench attention --dtype f32,bf16 --output FILE.h5`; bench_table.py),
with the columns of trident's attention_dtype table, so that `trident-analyze
bench FILE.h5` prints both.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F


def best(fn, reps):
    """Best CPU time and best wall time of reps calls, after a warm-up."""
    fn()
    c, w = float("inf"), float("inf")
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        c, w = min(c, time.process_time() - c0), min(w, time.perf_counter() - w0)
    return c, w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--mask", choices=["full", "causal"], default="causal")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bench-h5", help="add the rows to this trident bench file (torch_attention)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    S, D, H, causal = a.seq, a.head_dim, a.heads, a.mask == "causal"
    fwd_flops = 4.0 * D * H * (S * (S + 1) / 2 if causal else S * S)
    print(f"torch {torch.__version__}, 1 thread, SDPA, seq {S}, head_dim {D}, heads {H}, {a.mask}")
    print("| dtype | fwd CPU (s) | fwd GFLOP/s CPU | fwd GFLOP/s wall | fwd+bwd CPU (s) | "
          "fwd+bwd GFLOP/s CPU | fwd+bwd GFLOP/s wall |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for dt in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(1, H, S, D, dtype=dt, requires_grad=True) for _ in range(3))
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        def both():
            out = fwd()
            out.backward(torch.ones_like(out))
        with torch.no_grad():
            tf, wf = best(fwd, a.reps)
        tb, wb = best(both, a.reps)
        print(f"| {str(dt).split('.')[-1]} | {tf:.4f} | {fwd_flops / tf / 1e9:.1f} | "
              f"{fwd_flops / wf / 1e9:.1f} | {tb:.4f} | {3.5 * fwd_flops / tb / 1e9:.1f} | "
              f"{3.5 * fwd_flops / wb / 1e9:.1f} |")
        rows.append([a.mask, S, D, "f32" if dt == torch.float32 else "bf16",
                     f"torch {torch.__version__} SDPA", tf * 1e3, fwd_flops / tf / 1e9, tb * 1e3,
                     3.5 * fwd_flops / tb / 1e9, wf * 1e3, wb * 1e3])
    if a.bench_h5:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_table import add_table
        add_table(a.bench_h5, "torch_attention",
                  "PyTorch scaled_dot_product_attention on the CPU, 1 thread, best of "
                  f"{a.reps} (torch-attention-bench.py)",
                  ["mask", "seq", "head_dim", "dtype", "path", "fwd_cpu_ms", "fwd_cpu_GFLOP/s",
                   "fwdbwd_cpu_ms", "fwdbwd_cpu_GFLOP/s", "fwd_wall_ms", "fwdbwd_wall_ms"], rows,
                  [f"heads {H}; FLOPs as trident bench attention counts them (forward 4*D per "
                   "visible pair and head, backward 10*D); cpu_: the process's CPU time "
                   "(time.process_time), wall_: wall time; bf16: q, k, v bf16 (oneDNN's kernels)"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
