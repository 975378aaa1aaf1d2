#!/usr/bin/env python3
"""The GPU check's training part: `trident run` on a device against the CPU.

    scripts/gpu-train-check.py --bin TRIDENT [--mpirun "mpirun ..."] [--device cuda|emulated]
                               [--out DIR] [--peak-tflops 989]

Runs, with the quickstart model (share/trident/examples/quickstart.toml, a
top-2 MoE) and its dense twin (model.n_experts = 0):
  1. 1 rank, fp32, 10 steps on the device and on the CPU, compared as far as
     arithmetic allows: the dense model's loss within 1e-4 relative at every
     step; the MoE's at step 0, and at every later step while the router's
     choices (/metrics/expert_tokens) agree: a near-tie between two experts
     may send a token elsewhere under another summation order (seen on the
     CPU alone with another OpenBLAS kernel), after which the two runs are
     different but equally right. The line says which steps were compared;
  2. 1 rank, bf16 on the device against fp32 on the device: loss within
     2e-3 and gradient norm within 5e-2 relative at every step (gpu.md,
     "bf16 training"), and not equal (bf16 is not a no-op);
  3. 4 ranks sharing the one device through MPI's host staging
     (runtime.comm = "mpi"), pp2 cp2 and cp2 ep2, fp32, against 1 rank:
     the MoE's losses as in 1;
  4. throughput of a larger model in bf16 on 1 rank (d_model 1024, 8 layers,
     8 experts top-2, seq 8192; a small stand-in with --device emulated):
     tokens/s from the run file and MFU = tokens/s * FLOP/token / peak, with
     FLOP/token = 6 * active parameters + 6 * n_layers * seq * d_model
     (causal attention, forward and backward).
--device emulated is the dry run a CPU machine can do: the same runs on the
emulated device (exact equality is then expected, and the tolerances hold).
Needs a trident built with MPI, HDF5 and (for cuda) the CUDA backend. Reads
the run files with h5py where Python has it, else with --metrics BIN (the
GPU training bundle's gpu-run-metrics, scripts/gpu-run-metrics.c; default:
next to --bin), so plain Python 3 with no packages is enough.
Prints one line per check; exit 0 when all pass, 1 otherwise."""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

try:
    import h5py
except ImportError:  # the bundle's reader instead (read_steps)
    h5py = None

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(REPO, "share", "trident", "examples", "quickstart.toml")
ONE = ["data.num_microbatches=8", "parallel.pp=1", "parallel.cp=1", "parallel.ep=1",
       "topology.nodes=1", "topology.devices_per_node=1", "topology.nvlink_domain=1"]
FOUR = {
    "pp2 cp2": ["data.num_microbatches=8", "parallel.pp=2", "parallel.cp=2", "parallel.ep=1",
                "topology.nodes=1", "topology.devices_per_node=4", "topology.nvlink_domain=4"],
    "cp2 ep2": ["data.num_microbatches=4", "parallel.pp=1", "parallel.cp=2", "parallel.ep=2",
                "topology.nodes=1", "topology.devices_per_node=4", "topology.nvlink_domain=4"],
}
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(args, np_, sets, name, out):
    h5 = os.path.join(out, name + ".h5")
    cmd = shlex.split(args.mpirun) + ["-np", str(np_), args.bin, "run", QUICKSTART,
                                      "--output", h5]
    for s in ["train.steps=10", "output.checkpoint_every=0",
              "output.checkpoint_dir=" + os.path.join(out, "ck-" + name)] + sets:
        cmd += ["--set", s]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        said = [l for l in (p.stderr + p.stdout).splitlines() if l.startswith("trident")]
        check(False, "%s: exit %d in %.0f s: %s" % (name, p.returncode, time.time() - t0,
                                                   (said or [p.stderr.strip()[-300:]])[0]))
        return None
    return read_steps(args, h5, name)


COLUMNS = ("loss", "grad_norm", "tokens_per_s")


def read_steps(args, h5, name):
    """Every step's loss, gradient norm and tokens/s of a run file, and its
    tokens per (MoE layer, expert) under "experts" (one list per step)."""
    if h5py is not None:
        with h5py.File(h5, "r") as f:
            s = f["metrics/steps"]
            out = {k: [float(x) for x in s[k]] for k in COLUMNS}
            e = f.get("metrics/expert_tokens")
            steps = e[...] if e is not None else []  # a dense model has none
            out["experts"] = [[int(c) for c in step.flat] for step in steps]
            return out
    p = subprocess.run([args.metrics, h5], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        check(False, "%s: cannot read %s: %s" % (name, h5, p.stderr.strip()))
        return None
    lines = p.stdout.splitlines()
    header = lines[0].split()
    rows = [[float(x) for x in l.split()] for l in lines[1:]]
    out = {k: [r[header.index(k)] for r in rows] for k in COLUMNS}
    p = subprocess.run([args.metrics, h5, "--expert-tokens"], capture_output=True, text=True,
                       timeout=60)
    out["experts"] = [[int(c) for c in l.split()[1:]] for l in p.stdout.splitlines()]
    return out


def compare_dense(a, b, what):
    """Every step's loss within 1e-4: no choice in the model depends on a tie."""
    r = rel(a["loss"], b["loss"])
    check(r <= 1e-4, "%s: loss within 1e-4 at all %d steps (max rel %.2e)" %
          (what, len(b["loss"]), r))


def compare_moe(a, b, what):
    """Step 0's loss within 1e-4, and each later step's while the router's
    choices (tokens per layer and expert) agree; says which steps that was."""
    r0 = rel(a["loss"][:1], b["loss"][:1])
    check(r0 <= 1e-4, "%s: step 0 loss within 1e-4 (rel %.2e)" % (what, r0))
    n = len(b["loss"])
    parted = next((s for s, (x, y) in enumerate(zip(a["experts"], b["experts"])) if x != y), None)
    if len(a["experts"]) != n or len(b["experts"]) != n:
        check(False, "%s: no expert_tokens for every step to compare the router's choices" % what)
    elif parted is None:
        r = rel(a["loss"], b["loss"])
        check(r <= 1e-4, "%s: the router chose alike at all %d steps; loss within 1e-4 at each "
              "(max rel %.2e)" % (what, n, r))
    elif parted <= 1:
        print("note %s: the router's choices part at step %d (a near-tie); only step 0 compared" %
              (what, parted), flush=True)
    else:
        r = rel(a["loss"][:parted], b["loss"][:parted])
        check(r <= 1e-4, "%s: the router's choices part at step %d (a near-tie); loss within "
              "1e-4 at steps 0-%d (max rel %.2e), later steps not compared" %
              (what, parted, parted - 1, r))


def rel(a, b):
    if not a or len(a) != len(b):
        return float("inf")
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--mpirun", default="mpirun --allow-run-as-root --oversubscribe --bind-to none")
    ap.add_argument("--device", default="cuda", choices=["cuda", "emulated"])
    ap.add_argument("--out", default=None)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="bf16 dense peak (H100/H200)")
    ap.add_argument("--metrics", default=None,
                    help="run file reader where Python has no h5py (default: gpu-run-metrics "
                    "next to --bin)")
    args = ap.parse_args()
    if args.metrics is None:
        args.metrics = os.path.join(os.path.dirname(os.path.abspath(args.bin)), "gpu-run-metrics")
    if h5py is None and not os.access(args.metrics, os.X_OK):
        print("FAIL no h5py in this Python and no run file reader %s (--metrics)" % args.metrics)
        return 1
    out = args.out or tempfile.mkdtemp(prefix="trident-gpu-train-")
    os.makedirs(out, exist_ok=True)
    dev = ["runtime.backend=" + args.device]
    print("== training on %s (%s), runs in %s" % (args.device, args.bin, out), flush=True)

    dense = ["model.n_experts=0"]
    cpu_dense = run(args, 1, ONE + dense + ["runtime.backend=cpu"], "cpu-dense-fp32", out)
    gpu_dense = run(args, 1, ONE + dense + dev, args.device + "-dense-fp32", out)
    if cpu_dense and gpu_dense:
        compare_dense(gpu_dense, cpu_dense, "1 rank fp32 dense: %s against the CPU" % args.device)
    cpu = run(args, 1, ONE + ["runtime.backend=cpu"], "cpu-fp32", out)
    gpu = run(args, 1, ONE + dev, args.device + "-fp32", out)
    if cpu and gpu:
        compare_moe(gpu, cpu, "1 rank fp32 MoE: %s against the CPU" % args.device)
    bf = run(args, 1, ONE + dev + ['train.precision="bf16"'], args.device + "-bf16", out)
    if bf and gpu:
        lo, gn = rel(bf["loss"], gpu["loss"]), rel(bf["grad_norm"], gpu["grad_norm"])
        check(lo <= 2e-3 and gn <= 5e-2 and lo > 0,
              "1 rank bf16 against fp32: loss %.2e (<= 2e-3), grad norm %.2e (<= 5e-2), "
              "and not equal" % (lo, gn))
    for mesh, sets in FOUR.items():
        four = run(args, 4, sets + dev + ['runtime.comm="mpi"'], args.device + "-" +
                   mesh.replace(" ", ""), out)
        if four and gpu:
            compare_moe(four, gpu, "4 ranks sharing the device (%s, MPI staging) against 1 rank"
                        % mesh)

    if args.device == "cuda":
        d, L, E, k, f, seq, V = 1024, 8, 8, 2, 2816, 8192, 32000
        big = ["model.d_model=%d" % d, "model.n_layers=%d" % L, "model.n_heads=16",
               "model.n_kv_heads=8", "model.n_experts=%d" % E, "model.top_k=%d" % k,
               "model.ffn_hidden=%d" % f, "model.vocab_size=%d" % V, "data.seq_len=%d" % seq,
               "data.micro_batch_size=1", 'data.task="copy"']
    else:  # a stand-in the emulated device runs in seconds
        d, L, E, k, f, seq, V = 64, 2, 4, 2, 128, 256, 64
        big = ["model.d_model=%d" % d, "model.n_layers=%d" % L, "model.n_heads=4",
               "model.n_kv_heads=2", "model.n_experts=%d" % E, "model.top_k=%d" % k,
               "model.ffn_hidden=%d" % f, "model.vocab_size=%d" % V, "data.seq_len=%d" % seq,
               "data.micro_batch_size=1", 'data.task="copy"']
    thr = run(args, 1, ONE[1:] + dev + big + ['train.precision="bf16"',
                                              "data.num_microbatches=2"], "throughput", out)
    if thr:
        hd = d // (16 if args.device == "cuda" else 4)
        kv = 8 if args.device == "cuda" else 2
        attn_params = d * d * 2 + 2 * d * kv * hd
        active = L * (attn_params + d * E + k * 3 * d * f) + 2 * V * d
        flop_tok = 6 * active + 6 * L * seq * d
        warm = thr["tokens_per_s"][2:]  # the first steps warm up
        tps = statistics.median(warm) if warm else 0.0
        mfu = tps * flop_tok / (args.peak_tflops * 1e12)
        check(tps > 0, "throughput (bf16, d_model %d, %d layers, %d experts top-%d, seq %d): "
              "%.0f tokens/s, %.1f GFLOP/token, MFU %.1f%% of %.0f TFLOP/s" %
              (d, L, E, k, seq, tps, flop_tok / 1e9, 100 * mfu, args.peak_tflops))
    print("== %s" % ("PASS" if not failures else "FAIL: %d check(s)" % len(failures)))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
