#!/usr/bin/env python3
"""Prediction against measurement for the planner (share/trident/planner.md).

Calibrates this machine (trident plan --calibrate under mpirun), asks the search
for its first choice for 4 ranks (at the 4-rank meshes' global batch), then runs
every mesh of one model --runs times, round-robin over the meshes so that a change
of load touches them alike (trident run --machine, so each run file records its
prediction). Compares the median over runs of each run's median step time (the
steps after the first) with the predicted step time, and the largest allocator
peak over ranks and runs (/ranks/summary peak_alloc_bytes) with the predicted
memory that the allocator holds (memory_bytes.allocator: the total less what the
code keeps outside it).

Usage (repository root, after a build; nothing else should run on the machine):
  share/trident/benchmarks/planner-measure.py [--steps 4] [--runs 3] [--out DIR]
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

# Short steps (50-250 ms here): the same model, one sequence per micro-batch and
# two micro-batches, where what a step costs beyond its actions weighs most.
SHORT_MODEL = MODEL.replace("micro_batch_size = 4", "micro_batch_size = 1").replace(
    "num_microbatches = 4", "num_microbatches = 2")
SHORT_MESHES = [
    (1, []),  # the control: the calibration's own one-rank fit, so drift since it shows
    (2, []),
    (2, ["parallel.pp=2"]),
    (2, ["parallel.cp=2"]),
    (2, ["parallel.ep=2"]),
    (4, ["parallel.pp=2", "parallel.cp=2", "data.num_microbatches=4"]),
]

# The memory target: a dense model at 1024 tokens, where activations dominate.
MEMORY_MODEL = (MODEL.replace("n_experts = 8", "n_experts = 0").replace("seq_len = 256", "seq_len = 1024")
                .replace("micro_batch_size = 4", "micro_batch_size = 1"))
MEMORY_LIMITS = [0.85, 0.45, 0.4]  # shares of the unlimited first choice's predicted memory


def search_first(binary, cfg, machine, ranks, global_batch, memory_gb=None):
    """The search's first choice as (prediction, --set overrides)."""
    extra = ["--memory-gb", f"{memory_gb:.9f}"] if memory_gb else []
    b = json.loads(sh([binary, "plan", cfg, "--nodes", "1", "--devices-per-node", str(ranks), "--machine", machine,
                       "--search", "--top", "1", "--global-batch", str(global_batch), "--format", "json"]
                      + extra))["best"][0]
    sets = [f"parallel.pp={b['pp']}", f"parallel.cp={b['cp']}", f"parallel.ep={b['ep']}",
            f"parallel.vpp={b['vpp']}", f"parallel.schedule={b['schedule']}", f"parallel.cp_layout={b['cp_layout']}",
            f"data.micro_batch_size={b['micro_batch_size']}", f"data.num_microbatches={b['num_microbatches']}",
            f"parallel.cp_mode={b['cp_mode']}",
            f"parallel.cp_ulysses={b['cp_ulysses'] if b['cp_mode'] == 'hybrid' else 0}",
            f"train.recompute={b['recompute']}", f"train.recompute_layers={b['recompute_layers']}",
            f"train.optimizer_sharding={b['optimizer_sharding']}"]
    return b, sets


def memory_target(a, cfg, machine) -> int:
    """With limits below the unlimited first choice's memory, the search's
    choice under each limit, run: its measured allocator peak against the
    predicted allocator bytes."""
    ranks, batch = 4, 8
    free, free_sets = search_first(a.bin, cfg, machine, ranks, batch)
    rows = [("none", free, free_sets)]
    for share in MEMORY_LIMITS:
        limit = share * free["memory_bytes"]["total"] / 1e9
        b, sets = search_first(a.bin, cfg, machine, ranks, batch, limit)
        rows.append((f"{limit * 1e3:.2f} MB", b, sets))
    print(f"load average (1 min) before {os.getloadavg()[0]:.1f}")
    print("| --memory-gb | search's first choice | predicted allocator MB | measured allocator peak MB "
          "| pred/meas | predicted step s | measured step s |")
    print("|---|---|---|---|---|---|---|")
    out = []
    for limit, b, sets in rows:
        runs = [run_mesh(a.bin, cfg, machine, ranks, sets, a.steps, a.out, rep) for rep in range(a.runs)]
        meas = max(r["alloc_peak"] for r in runs)
        step = statistics.median(r["step_s"] for r in runs)
        pred = b["memory_bytes"]["allocator"]
        short = " ".join(x.split(".", 1)[1] for x in sets if not x.endswith(("=1", "=0", "=none", "=zigzag", "=ring")))
        print(f"| {limit} | {short} | {pred / 1e6:.2f} | {meas / 1e6:.2f} | {pred / meas:.3f} | "
              f"{b['step_time_s']:.3f} | {step:.3f} |", flush=True)
        out.append({"limit": limit, "sets": sets, "prediction": b, "runs": runs})
    print(f"load average (1 min) after {os.getloadavg()[0]:.1f}; {a.runs} runs of {a.steps} steps each")
    with open(f"{a.out}/memory.json", "w") as f:
        json.dump(out, f, indent=1)
    return 0


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
# The context-parallel modes (parallel.cp_mode): Ulysses alone and the hybrid
# (Ulysses groups of cp_ulysses ranks under a ring), next to the plain ring above.
CP_MESHES = [
    (2, ["parallel.cp=2"]),
    (2, ["parallel.cp=2", "parallel.cp_mode=ulysses"]),
    (4, ["parallel.cp=4", "parallel.cp_mode=ulysses"]),
    (4, ["parallel.cp=4", "parallel.cp_mode=hybrid", "parallel.cp_ulysses=2"]),
    (4, ["parallel.cp=4"]),
    (8, ["parallel.pp=2", "parallel.cp=4", "parallel.cp_mode=hybrid", "parallel.cp_ulysses=2"]),
]


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def mesh_name(sets: list[str], np_: int) -> str:
    short = [s.replace("parallel.", "").replace("data.num_microbatches", "m").replace("data.micro_batch_size", "mbs")
             .replace("=", "") for s in sets]
    return ("mesh-" + "-".join(short) if sets else "mesh-dp" if np_ > 1 else "mesh-one") + f"-np{np_}"


def predict_mesh(binary, cfg, machine, np_, sets):
    setargs = [a for s in sets for a in ("--set", s)]
    return json.loads(sh([binary, "plan", cfg, "--nodes", "1", "--devices-per-node", str(np_), "--machine", machine,
                          "--format", "json"] + setargs))["prediction"]


def run_mesh(binary, cfg, machine, np_, sets, steps, out, rep):
    """One run: the median step time after the first step, and the largest
    allocator peak over ranks (/ranks/summary peak_alloc_bytes)."""
    name = mesh_name(sets, np_)
    setargs = [a for s in sets + [f"train.steps={steps}", f"output.checkpoint_dir={out}/ckpt-{name}"]
               for a in ("--set", s)]
    h5 = f"{out}/{name}-r{rep}.h5"
    r = subprocess.run(MPIRUN + ["-np", str(np_), binary, "run", cfg, "--output", h5, "--machine", machine] + setargs,
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"run {name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    with h5py.File(h5, "r") as f:
        st = np.asarray(f["/metrics/steps"]["step_time_s"], dtype=np.float64)[1:]
        rs = f["/ranks/summary"][()]
    os.remove(h5)
    return {"step_s": float(statistics.median(st)), "step_times": [float(x) for x in st],
            "alloc_peak": float(np.max(rs["peak_alloc_bytes"])), "rss_peak": float(np.max(rs["peak_rss_bytes"])),
            "load": os.getloadavg()[0]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default="build/trident")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="runs per mesh (the table gives their median)")
    ap.add_argument("--out", default="/tmp/trident-planner")
    ap.add_argument("--calibrate-ranks", type=int, default=4)
    ap.add_argument("--machine", default=None, help="use this profile instead of calibrating")
    ap.add_argument("--meshes", choices=["all", "cp", "short", "memory"], default="all",
                    help="cp: only the context-parallel modes' meshes (CP_MESHES), no search; short: "
                         "SHORT_MODEL (one sequence per micro-batch) on SHORT_MESHES, no search; memory: "
                         "MEMORY_MODEL's search under limits below its best mesh's memory, each choice run")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cfg = f"{a.out}/model.toml"
    with open(cfg, "w") as f:
        f.write({"short": SHORT_MODEL, "memory": MEMORY_MODEL}.get(a.meshes, MODEL))
    machine = a.machine or f"{a.out}/machine.toml"
    if not a.machine:
        print(sh(MPIRUN + ["-np", str(a.calibrate_ranks), a.bin, "plan", cfg, "--calibrate", "--out", machine]),
              flush=True)
    if a.meshes == "memory":
        return memory_target(a, cfg, machine)
    load_before = os.getloadavg()
    # the search's first choice for the 4-rank meshes (same global batch) is measured with them
    big = 4
    if a.meshes != "all":
        return measure(a, cfg, machine, CP_MESHES if a.meshes == "cp" else SHORT_MESHES, load_before, big)
    search = json.loads(sh([a.bin, "plan", cfg, "--nodes", "1", "--devices-per-node", str(big), "--machine",
                            machine, "--search", "--top", "1", "--global-batch", str(GLOBAL_BATCH_4),
                            "--format", "json"]))
    b = search["best"][0]
    first = [f"parallel.pp={b['pp']}", f"parallel.cp={b['cp']}", f"parallel.ep={b['ep']}",
             f"parallel.vpp={b['vpp']}", f"parallel.schedule={b['schedule']}", f"parallel.cp_layout={b['cp_layout']}",
             f"data.micro_batch_size={b['micro_batch_size']}", f"data.num_microbatches={b['num_microbatches']}"]
    first += [f"parallel.cp_mode={b['cp_mode']}",
              f"parallel.cp_ulysses={b['cp_ulysses'] if b['cp_mode'] == 'hybrid' else 0}",
              f"train.recompute={b['recompute']}", f"train.recompute_layers={b['recompute_layers']}",
              f"train.optimizer_sharding={b['optimizer_sharding']}"]
    return measure(a, cfg, machine, MESHES + CP_MESHES + [(big, first)], load_before, big)


def measure(a, cfg, machine, meshes, load_before, big) -> int:
    results = [{"name": mesh_name(s, n), "ranks": n, "sets": s, "prediction": predict_mesh(a.bin, cfg, machine, n, s),
                "runs": []} for n, s in meshes]
    if a.meshes == "all":
        results[-1]["search_first"] = True
    # round-robin over the meshes, so that a change of load touches all of them alike
    for rep in range(a.runs):
        for res in results:
            res["runs"].append(run_mesh(a.bin, cfg, machine, res["ranks"], res["sets"], a.steps, a.out, rep))
            print(f"{res['name']} run {rep}: {res['runs'][-1]['step_s']:.3f} s, load {res['runs'][-1]['load']:.1f}",
                  flush=True)
    for res in results:
        pm = res["prediction"]["memory_bytes"]
        res |= {"pred_step_s": res["prediction"]["step_time_s"],
                "meas_step_s": float(statistics.median(r["step_s"] for r in res["runs"])),
                "pred_alloc": pm["allocator"], "pred_total": pm["total"],
                "meas_alloc": max(r["alloc_peak"] for r in res["runs"]),
                "meas_rss": max(r["rss_peak"] for r in res["runs"])}
    load_after = os.getloadavg()
    loads = [r["load"] for res in results for r in res["runs"]]
    print(f"load average (1 min) before {load_before[0]:.1f}, during {min(loads):.1f}-{max(loads):.1f}, "
          f"after {load_after[0]:.1f}; {a.runs} runs of {a.steps} steps per mesh")
    print("| ranks | mesh | predicted step s | measured median s | pred/meas | predicted allocator peak MB "
          "| measured allocator peak MB | pred/meas | predicted total MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        tag = " (search's first choice)" if r.get("search_first") else ""
        print(f"| {r['ranks']} | {' '.join(s.replace('parallel.', '').replace('data.', '') for s in r['sets']) or ('dp only' if r['ranks'] > 1 else 'one rank')}"
              f"{tag} | {r['pred_step_s']:.3f} | {r['meas_step_s']:.3f} | {r['pred_step_s'] / r['meas_step_s']:.2f} | "
              f"{r['pred_alloc'] / 1e6:.2f} | {r['meas_alloc'] / 1e6:.2f} | {r['pred_alloc'] / r['meas_alloc']:.3f} | "
              f"{r['pred_total'] / 1e6:.1f} |")
    if a.meshes == "all":
        same = [r for r in results if r["ranks"] == big]
        fastest = min(same, key=lambda r: r["meas_step_s"])
        chosen = results[-1]
        print(f"{big} ranks: the search's first choice {chosen['name']} measured {chosen['meas_step_s']:.3f} s; "
              f"measured fastest {fastest['name']} {fastest['meas_step_s']:.3f} s "
              f"({100 * (chosen['meas_step_s'] / fastest['meas_step_s'] - 1):.1f}% slower)")
        # the ranking the predictions give the measured meshes themselves
        listed = [r for r in same if not r.get("search_first")]
        ranked = sorted(listed, key=lambda r: r["pred_step_s"])
        fastest_listed = min(listed, key=lambda r: r["meas_step_s"])
        print(f"{big} ranks, the listed meshes by prediction: "
              + ", ".join(f"{r['name']} {r['pred_step_s']:.3f}/{r['meas_step_s']:.3f}" for r in ranked))
        print(f"  predicted fastest {ranked[0]['name']} measured {ranked[0]['meas_step_s']:.3f} s, measured fastest "
              f"{fastest_listed['name']} {fastest_listed['meas_step_s']:.3f} s "
              f"({100 * (ranked[0]['meas_step_s'] / fastest_listed['meas_step_s'] - 1):.1f}% slower)")
    with open(f"{a.out}/results.json", "w") as f:
        json.dump({"load_before": load_before, "load_after": load_after, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
