#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention on the GPU, for the same shapes and
FLOP count as trident_gpu_bench (bf16, batch 1, head_dim 128, causal and
full, forward and forward+backward). Prints "seq mask pass tflops" lines that
trident_gpu_bench --torch reads. Exit 77 when torch or a CUDA device is
missing (the check then reports that column as absent)."""
import argparse
import sys


def visible_pairs(seq: int, heads: int, causal: bool) -> int:
    return heads * (seq * (seq + 1) // 2 if causal else seq * seq)


def median_ms(torch, fn, iters: int) -> float:
    fn()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--seqs", default="4096,8192,16384")
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"SKIP: torch not importable ({e})", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA device", file=sys.stderr)
        return 77
    d = 128
    for seq in (int(s) for s in args.seqs.split(",")):
        for causal in (True, False):
            shape = (1, args.heads, seq, d)
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def fwdbwd():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                out.backward(dout)

            pairs = visible_pairs(seq, args.heads, causal)
            mask = "causal" if causal else "full"
            for name, fn, flops in (("fwd", fwd, 4 * d * pairs),
                                    ("fwdbwd", fwdbwd, 14 * d * pairs)):
                ms = median_ms(torch, fn, args.iters)
                print(f"{seq} {mask} {name} {flops / (ms * 1e-3) / 1e12:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
