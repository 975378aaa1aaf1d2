#!/usr/bin/env python3
"""Native bf16 on the CPU (issue 48, share/trident/cpu-kernels.md#native-bf16):
the quickstart model with a dense FFN (every GEMM bf16) and with its MoE
layers (4 experts, top-2: the experts' GEMMs bf16 too) on one rank, 12 steps
each, in fp32, in bf16 on the staged path (TRIDENT_CPU_BF16=staged) and in
bf16 on the native path (TRIDENT_CPU_BF16=native): the native run is not the
staged run (its GEMMs ran on the bf16 units), every step's loss and gradient
norm of both stay within the documented bf16 tolerance of fp32
(gpu.md#bf16), and the native run trains. The planner's memory model holds the bf16 copies
of the GEMM weights: `trident plan`'s parameter bytes equal each run's
peak_parameters_bytes (fp32 masters, plus 2 bytes per GEMM weight under bf16).
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
ONE_RANK = ["--set", "parallel.pp=1", "--set", "parallel.cp=1", "--set", "parallel.ep=1",
            "--set", "topology.nodes=1", "--set", "topology.devices_per_node=1",
            "--set", "topology.nvlink_domain=1"]
MODELS = (("dense", ["--set", "model.n_experts=0"]), ("MoE", []))


def has_avx512_bf16():
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and " avx512_bf16" in line for line in f)


def steps(path):
    with h5py.File(path, "r") as f:
        return f["metrics/steps"][:]


def parameter_bytes(path):
    with h5py.File(path, "r") as f:
        return int(f["/ranks/summary"][()]["peak_parameters_bytes"][0])


def planned_parameter_bytes(prec, extra):
    """trident plan's parameter bytes for the run's own one-rank mesh."""
    out = subprocess.run([BIN, "plan", QUICKSTART, "--set", "train.precision=" + prec, "--nodes", "1",
                          "--devices-per-node", "1", "--machine",
                          os.path.join(SRC, "share/trident/machines/h100-sxm.toml"), "--format", "json"]
                         + ONE_RANK[:6] + extra, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return "trident plan exit %d: %s" % (out.returncode, out.stderr[-300:])
    return int(json.loads(out.stdout)["prediction"]["memory_bytes"]["params"])


def check_planned_memory(model, extra, measured):
    """The planner's parameters (bf16 copies included) against each run's:
    the copies (bf16 - fp32) exactly; the whole within 1e-4 (the planner does
    not count the MoE router's bias nor the parameter store's range padding:
    32 floats in this MoE model, none in the dense one)."""
    planned = {"fp32": planned_parameter_bytes("fp32", extra),
               "bf16": planned_parameter_bytes("bf16", extra)}
    if not all(isinstance(v, int) for v in planned.values()):
        check(False, "%s: trident plan runs (%s)" % (model, planned))
        return
    copies = planned["bf16"] - planned["fp32"]
    for name, prec in (("fp32", "fp32"), ("staged", "bf16"), ("native", "bf16")):
        rel = abs(planned[prec] - measured[name]) / measured[name]
        check(rel <= 1e-4, "%s %s: the planner's parameter bytes %d within 1e-4 of the run's %d"
              % (model, name, planned[prec], measured[name]))
        if prec == "bf16":
            check(measured[name] - measured["fp32"] == copies > 0,
                  "%s %s: the bf16 weight copies, %d bytes, are the planner's %d"
                  % (model, name, measured[name] - measured["fp32"], copies))


def compare(d, model, extra):
    """fp32, staged and native bf16 runs of one model; False: a run failed."""
    runs, params = {}, {}
    for name, prec, mode in (("fp32", "fp32", "auto"), ("staged", "bf16", "staged"),
                             ("native", "bf16", "native")):
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
        params[name] = parameter_bytes(out)
    check_planned_memory(model, extra, params)
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
