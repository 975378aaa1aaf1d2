#!/usr/bin/env python3
"""Prediction against measurement for the planner (share/trident/planner.md).

Calibrates this machine (trident plan --calibrate under mpirun), then, for each
mesh of one model: predicts it (trident plan --machine --format json), runs it
(trident run --machine, so the run file records the prediction), and compares
the median step time after the first step, and the steps' peak memory above the
rank's memory before the first step (the kernel's resident-set high-water mark,
reset when the steps begin: host tensors are not counted by an allocator yet)
with the predicted activations + buffers + workspace. Also asks the search for its first
choice for 4 ranks (at the 4-rank meshes' global batch) and runs it too.

Usage (repository root, after a build; nothing else should run on the machine):
  share/trident/benchmarks/planner-measure.py [--steps 4] [--out DIR]
Prints a Markdown table and writes DIR/results.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import h5py
import numpy as np

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ucx", "--mca", "pml_ucx_devices",
          "any", "--mca", "pml_ucx_tls", "any", "--mca", "btl", "^vader,openib", "--bind-to", "none"]

MODEL = """# planner measurement model: small enough for 2 cores, every parallelism possible
[model]
vocab_size = 256
d_model = 128
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_hidden = 256
n_experts = 8
top_k = 2
moe_every = 2
[data]
task = "recall"
seq_len = 256
micro_batch_size = 4
num_microbatches = 4
[train]
warmup_steps = 1
"""

# (ranks, overrides): each parallelism alone and combined, three schedules, two
# micro-batch counts. The 4-rank meshes all step 16 sequences, like the search
# asked below, so that their step times rank them.
GLOBAL_BATCH_4 = 32
MESHES = [
    (2, []),
    (2, ["parallel.pp=2"]),
    (2, ["parallel.cp=2"]),
    (2, ["parallel.ep=2"]),
    (4, ["parallel.pp=2", "parallel.cp=2", "data.num_microbatches=8"]),
    (4, ["parallel.pp=2", "parallel.cp=2", "parallel.schedule=zb-h1", "data.num_microbatches=8"]),
    (4, ["parallel.pp=2", "parallel.ep=2", "parallel.schedule=afab"]),
    (4, ["parallel.pp=4", "data.num_microbatches=8"]),
    (4, ["parallel.cp=2", "parallel.ep=2"]),
    (8, ["parallel.pp=2", "parallel.cp=2", "parallel.ep=2"]),
]


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def status_bytes(pid: int, key: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("nan")


def rank_pids(marker: str) -> list[int]:
    """The trident rank processes whose command line holds marker (not mpirun)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"trident") and any(marker.encode() in a for a in argv):
            pids.append(int(d))
    return pids


class StepMemory:
    """Each rank's resident set when the steps begin, and its high-water mark
    (the kernel's VmHWM, reset then through /proc/PID/clear_refs) once a later
    step is done, before the final checkpoint: the steps' peak, with nothing
    missed between samples."""

    def __init__(self, marker: str):
        self.marker = marker
        self.before: dict[int, float] = {}
        self.peak: dict[int, float] = {}

    def steps_begin(self):
        for p in rank_pids(self.marker):
            self.before[p] = status_bytes(p, "VmRSS")
            with open(f"/proc/{p}/clear_refs", "w") as f:
                f.write("5")

    def steps_done(self):
        for p in self.before:
            self.peak[p] = status_bytes(p, "VmHWM")

    def grown(self) -> float:
        return max((self.peak[p] - self.before[p] for p in self.peak), default=float("nan"))


def run_mesh(binary, cfg, machine, np_, sets, steps, out):
    name = "mesh-" + "-".join(s.replace("parallel.", "").replace("data.num_microbatches", "m").replace("=", "")
                              for s in sets) if sets else "mesh-dp"
    name = f"{name}-np{np_}"
    setargs = [a for s in sets + [f"train.steps={steps}", f"output.checkpoint_dir={out}/ckpt-{name}"]
               for a in ("--set", s)]
    pred = json.loads(sh([binary, "plan", cfg, "--nodes", "1", "--devices-per-node", str(np_), "--machine", machine,
                          "--format", "json"] + setargs))["prediction"]
    h5 = f"{out}/{name}.h5"
    memory = StepMemory(h5)
    proc = subprocess.Popen(MPIRUN + ["-np", str(np_), binary, "run", cfg, "--output", h5, "--machine", machine]
                            + setargs, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("trident run:"):  # every rank has built its model (the run file is collective)
            memory.steps_begin()
        if line.startswith(f"step {steps - 2:5d}"):  # a step before the last: no checkpoint yet
            memory.steps_done()
    proc.wait()
    if proc.returncode != 0:
        sys.exit(f"run {name} failed:\n{''.join(lines[-30:])}")
    with h5py.File(h5, "r") as f:
        st = np.asarray(f["/metrics/steps"]["step_time_s"], dtype=np.float64)[1:]
    dyn_pred = pred["memory_bytes"]["activations"] + pred["memory_bytes"]["comm_buffers"] + \
        pred["memory_bytes"]["workspace"]
    return {"name": name, "ranks": np_, "sets": sets, "pred_step_s": pred["step_time_s"],
            "meas_step_s": float(statistics.median(st)), "step_times": [float(x) for x in st],
            "pred_step_mem": dyn_pred, "meas_step_mem": memory.grown(),
            "pred_total_mem": pred["memory_bytes"]["total"], "prediction": pred}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/trident")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default="/tmp/trident-planner")
    ap.add_argument("--calibrate-ranks", type=int, default=4)
    ap.add_argument("--machine", default=None, help="use this profile instead of calibrating")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cfg = f"{a.out}/model.toml"
    with open(cfg, "w") as f:
        f.write(MODEL)
    machine = a.machine or f"{a.out}/machine.toml"
    if not a.machine:
        print(sh(MPIRUN + ["-np", str(a.calibrate_ranks), a.bin, "plan", cfg, "--calibrate", "--out", machine]))
    load_before = os.getloadavg()
    results = [run_mesh(a.bin, cfg, machine, n, s, a.steps, a.out) for n, s in MESHES]
    # the search's first choice for the 4-rank meshes (same global batch), run as well
    big = 4
    search = json.loads(sh([a.bin, "plan", cfg, "--nodes", "1", "--devices-per-node", str(big), "--machine",
                            machine, "--search", "--top", "1", "--global-batch", str(GLOBAL_BATCH_4),
                            "--format", "json"]))
    b = search["best"][0]
    first = [f"parallel.pp={b['pp']}", f"parallel.cp={b['cp']}", f"parallel.ep={b['ep']}",
             f"parallel.vpp={b['vpp']}", f"parallel.schedule={b['schedule']}", f"parallel.cp_layout={b['cp_layout']}",
             f"data.micro_batch_size={b['micro_batch_size']}", f"data.num_microbatches={b['num_microbatches']}"]
    results.append(run_mesh(a.bin, cfg, machine, big, first, a.steps, a.out) | {"search_first": True})
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} (1 min)")
    print("| ranks | mesh | predicted step s | measured median s | pred/meas | predicted step memory MB "
          "| measured MB | pred/meas |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        tag = " (search's first choice)" if r.get("search_first") else ""
        print(f"| {r['ranks']} | {' '.join(r['sets']) or 'dp only'}{tag} | {r['pred_step_s']:.3f} | "
              f"{r['meas_step_s']:.3f} | {r['pred_step_s'] / r['meas_step_s']:.2f} | "
              f"{r['pred_step_mem'] / 1e6:.1f} | {r['meas_step_mem'] / 1e6:.1f} | "
              f"{r['pred_step_mem'] / r['meas_step_mem']:.2f} |")
    same = [r for r in results if r["ranks"] == big]
    fastest = min(same, key=lambda r: r["meas_step_s"])
    chosen = min(same, key=lambda r: r["pred_step_s"])
    print(f"{big} ranks: predicted fastest {chosen['name']} measured {chosen['meas_step_s']:.3f} s; "
          f"measured fastest {fastest['name']} {fastest['meas_step_s']:.3f} s "
          f"({100 * (chosen['meas_step_s'] / fastest['meas_step_s'] - 1):.1f}% slower)")
    with open(f"{a.out}/results.json", "w") as f:
        json.dump({"load_before": load_before, "load_after": load_after, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
