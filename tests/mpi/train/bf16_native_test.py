#!/usr/bin/env python3
"""Native bf16 on the CPU (issue 48, share/trident/cpu-kernels.md#native-bf16):
the quickstart model with a dense FFN (every GEMM bf16) and with its MoE
layers (4 experts, top-2: the experts' GEMMs bf16 too) on one rank, 12 steps
each, in fp32, in bf16 on the staged path (TRIDENT_CPU_BF16=staged) and in
bf16 on the native path (TRIDENT_CPU_BF16=native): the native run is not the
staged run (its GEMMs ran on the bf16 units), every step's loss and gradient
norm of both stay within the documented bf16 tolerance of fp32
(gpu.md#bf16), and the native run trains. The planner's memory model holds the bf16 copies
of the GEMM weights: `trident plan`'s parameter bytes, planned under the
run's TRIDENT_CPU_BF16, equal each run's peak_parameters_bytes (fp32 masters
and the MoE routers' bias buffers, plus 2 bytes per GEMM weight on the staged
bf16 path; none on the native path, which packs the masters instead of
copying them: planner.md, so its parameter bytes are the fp32 run's), and
its activation bytes follow what
the run stores per precision (bf16 h1, q, k, v, o and the dense FFN's h,
gate and up under bf16): the run's peak_activations_bytes lies between the
planner's activations and its activations plus the kernels' scratch
(ACT_RTOL below), for fp32 and native bf16; the staged run, which widens
its bf16 operands into f32 copies, holds more (only the lower bound).
A bad TRIDENT_CPU_BF16 is one line and exit code 2.
Exits 77 (ctest: skipped) on a CPU without AVX512-BF16."""
import os
import sys
import tempfile

import json
import subprocess

import h5py
import numpy as np

from mpirun_cli import BIN, check, launch, verdict

SRC = os.environ["TRIDENT_SOURCE_DIR"]
QUICKSTART = os.path.join(SRC, "share/trident/examples/quickstart.toml")
STEPS = 12
LOSS_RTOL = 2e-3        # gpu.md#bf16
GRAD_NORM_RTOL = 5e-2
# The run's activation kind holds the kernels' scratch too (allocated while
# a step runs), which the planner counts under workspace: its activation
# figure is a lower bound of the run's peak, and with its allocator-held
# workspace an upper bound, each within ACT_RTOL (the planner replays whole
# tensors; the run's allocator rounds blocks and frees within an op).
ACT_RTOL = 0.03
ONE_RANK = ["--set", "parallel.pp=1", "--set", "parallel.cp=1", "--set", "parallel.ep=1",
            "--set", "topology.nodes=1", "--set", "topology.devices_per_node=1",
            "--set", "topology.nvlink_domain=1"]
MODELS = (("dense", ["--set", "model.n_experts=0"]), ("MoE", []))
RUNS = (("fp32", "fp32", "auto"), ("staged", "bf16", "staged"), ("native", "bf16", "native"))


def has_avx512_bf16():
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " avx512_bf16" in line for line in f)


def steps(path):
    with h5py.File(path, "r") as f:
        return f["metrics/steps"][:]


def memory_bytes(path):
    """The run's peak parameter and activation bytes (rank 0)."""
    with h5py.File(path, "r") as f:
        s = f["/ranks/summary"][()]
        return {"params": int(s["peak_parameters_bytes"][0]),
                "activations": int(s["peak_activations_bytes"][0])}


def planned_memory_bytes(prec, mode, extra):
    """trident plan's parameter and activation bytes for the run's own one-rank mesh and CPU
    bf16 path."""
    out = subprocess.run([BIN, "plan", QUICKSTART, "--set", "train.precision=" + prec, "--nodes", "1",
                          "--devices-per-node", "1", "--machine",
                          os.path.join(SRC, "share/trident/machines/h100-sxm.toml"), "--format", "json"]
                         + ONE_RANK[:6] + extra, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, TRIDENT_CPU_BF16=mode))
    if out.returncode != 0:
        return "trident plan exit %d: %s" % (out.returncode, out.stderr[-300:])
    m = json.loads(out.stdout)["prediction"]["memory_bytes"]
    return {"params": int(m["params"]), "activations": int(m["activations"]),
            "scratch": int(m["workspace"] - (m["untracked"] - m["packed_weights"]))}


def check_planned_memory(model, extra, measured):
    """The planner's memory against each run's: parameters (bf16 copies and
    the routers' bias buffers included) equal to the byte; activations within
    ACT_RTOL."""
    planned = {name: planned_memory_bytes(prec, mode, extra) for name, prec, mode in RUNS}
    if not all(isinstance(v, dict) for v in planned.values()):
        check(False, "%s: trident plan runs (%s)" % (model, planned))
        return
    for name in planned:
        p, m = planned[name], measured[name]
        check(p["params"] == m["params"], "%s %s: the planner's parameter bytes %d are the run's %d"
              % (model, name, p["params"], m["params"]))
        low, high = p["activations"], p["activations"] + p["scratch"]
        if name == "staged":
            high = float("inf")  # the staged row's f32 copies of its operands: not modelled
        tol = ACT_RTOL * m["activations"]
        check(low - tol <= m["activations"] <= high + tol,
              "%s %s: the run's activation bytes %d between the planner's activations %d and with "
              "its scratch %s (%.0f%% each way)" % (model, name, m["activations"], low,
                                                   "-" if high == float("inf") else "%d" % high,
                                                   100 * ACT_RTOL))


def compare(d, model, extra):
    """fp32, staged and native bf16 runs of one model; False: a run failed."""
    runs, memory = {}, {}
    for name, prec, mode in RUNS:
        out = os.path.join(d, "%s-%s.h5" % (model, name))
        rc, _, err, secs = launch(1, [QUICKSTART, "--set", "train.steps=%d" % STEPS,
                                      "--set", "train.precision=" + prec,
                                      "--set", "output.checkpoint_dir=" + os.path.join(d, "ck-%s-%s" % (model, name)),
                                      "--set", "output.timeline=false", "--output", out] + ONE_RANK + extra,
                                  env={"TRIDENT_CPU_BF16": mode}, timeout=240)
        check(rc == 0, "%s %s run exits 0 (%.0f s)%s" % (model, name, secs, "" if rc == 0 else ": " + err[-400:]))
        if rc != 0:
            return False
        runs[name] = steps(out)
        memory[name] = memory_bytes(out)
    check_planned_memory(model, extra, memory)
    check(memory["native"]["params"] == memory["fp32"]["params"] < memory["staged"]["params"],
          "%s: the native run keeps no bf16 weight copy: its parameter bytes %d are the fp32 run's "
          "%d, below the staged run's %d" % (model, memory["native"]["params"],
                                             memory["fp32"]["params"], memory["staged"]["params"]))
    a, s, n = runs["fp32"], runs["staged"], runs["native"]
    check(len(a) == len(s) == len(n) == STEPS, "%s: every run has %d steps" % (model, STEPS))
    diff = np.abs(n["loss"] - s["loss"]) / np.abs(s["loss"])
    check(diff.max() > 1e-7, "%s: the native run is not the staged run (largest loss difference %.2e)"
          % (model, diff.max()))
    for name, b in (("staged", s), ("native", n)):
        rel = np.abs(b["loss"] - a["loss"]) / np.abs(a["loss"])
        check(rel.max() <= LOSS_RTOL, "%s: bf16 %s loss within %.0e of fp32 in every step (max %.2e)"
              % (model, name, LOSS_RTOL, rel.max()))
        gn = np.abs(b["grad_norm"] - a["grad_norm"]) / np.abs(a["grad_norm"])
        check(gn.max() <= GRAD_NORM_RTOL, "%s: bf16 %s gradient norm within %.0e of fp32 (max %.2e)"
              % (model, name, GRAD_NORM_RTOL, gn.max()))
    check(n["loss"][-1] < 0.8 * n["loss"][0], "%s: bf16 native trains: loss %.4f -> %.4f"
          % (model, n["loss"][0], n["loss"][-1]))
    return True


def main():
    if not has_avx512_bf16():
        print("SKIP: this CPU has no AVX512-BF16 (vdpbf16ps): only the staged bf16 path runs "
              "(tested by train_precision_bf16)")
        return 77
    with tempfile.TemporaryDirectory() as d:
        for model, extra in MODELS:
            if not compare(d, model, extra):
                return verdict()
        rc, out, err, _ = launch(1, [QUICKSTART, "--set", "train.steps=1", "--set", "train.precision=bf16",
                                     "--set", "output.checkpoint_dir=" + os.path.join(d, "ck-bad"),
                                     "--output", os.path.join(d, "bad.h5")] + ONE_RANK,
                                 env={"TRIDENT_CPU_BF16": "fast"})
        said = [l for l in (out + err).splitlines() if "TRIDENT_CPU_BF16=fast" in l]
        check(rc == 2 and len(said) >= 1,
              "TRIDENT_CPU_BF16=fast: exit 2 and a line naming it (exit %d: %s)" % (rc, said[:1]))
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
