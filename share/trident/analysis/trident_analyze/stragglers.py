"""`trident-analyze stragglers`: which rank was slow, and whom the others waited on.

Reads /ranks/steps (format_version 2; share/trident/hdf5-layout.md): every
rank's compute seconds by phase and wait seconds by kind per window of
output.rank_stats_every steps, with rank 0's scores. A file without the
table (format_version 1, or a run with rank_stats_every = 0) is analysed
from /ranks/summary, the whole run in one row per rank, and says so.

What the slowest rank cost: a first-order estimate (the step minus its
excess compute), and the step time the schedule simulator (`trident
schedule --simulate`, the binary on PATH or $TRIDENT_BIN) predicts with
that rank's stage at its other ranks' pace.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np

from .runfile import COMM_KINDS, AnalysisError, RunFile, decode

PHASES = ("forward", "backward", "weight", "optimizer", "data", "checkpoint")
# the phases a straggler score counts (a save's staging is not the same work on every rank)
SCORED = PHASES[:5]


def _per_rank_from_table(t) -> dict:
    """{rank: totals over the run} from /ranks/steps' rows."""
    out: dict = {}
    for row in t:
        r = int(row["rank"])
        d = out.setdefault(r, {"rank": r, "host": decode(row["host"]), "stage": int(row["stage"]),
                               "steps": 0, "compute_s": np.zeros(6), "wait_s": np.zeros(4),
                               "waited_on_s": 0.0, "step_s": 0.0, "scores": [], "peers": {}})
        d["steps"] += int(row["steps"])
        d["compute_s"] += np.asarray(row["compute_s"], dtype=float)
        d["wait_s"] += np.asarray(row["wait_s"], dtype=float)
        d["waited_on_s"] += float(row["waited_on_s"])
        d["step_s"] += float(row["step_s"])
        d["scores"].append(float(row["score"]))
        if int(row["peer"]) >= 0:
            d["peers"][int(row["peer"])] = d["peers"].get(int(row["peer"]), 0.0) + float(row["peer_wait_s"])
    return out


def _straggler_events(rf: RunFile) -> list:
    if not rf.has("/events"):
        return []
    return [{"step": int(e["step"]), "rank": int(e["rank"]), "score": float(e["value"]),
             "threshold": float(e["reference"]), "detail": decode(e["detail"])}
            for e in rf.h5["/events"][()] if decode(e["kind"]) == "straggler"]


def _cost(rf: RunFile, ranks: dict, slowest: int) -> dict:
    """What the slowest rank cost: the median step time next to it without
    that rank's excess compute per step over its stage's other ranks (the
    critical path runs through the rank everyone waits on once per step, so
    the excess is a first-order estimate of the time lost)."""
    steps = rf.steps()
    measured = float(np.median(steps["step_time_s"])) if len(steps) else 0.0
    me = ranks[slowest]
    peers = [d for r, d in ranks.items() if r != slowest and d["stage"] == me["stage"]]
    per_step = lambda d: float(d["compute_s"][:5].sum()) / max(1, d["steps"])
    if not peers:
        return {"measured_step_s": measured, "without_slowest_s": None,
                "why": "the slowest rank is alone in its pipeline stage: no peer to compare with"}
    excess = max(0.0, per_step(me) - float(np.median([per_step(d) for d in peers])))
    return {"measured_step_s": measured, "without_slowest_s": max(0.0, measured - excess),
            "excess_per_step_s": excess}


def _virtual_stage_ranks(schedule: str, pp: int, vpp: int) -> list:
    """The pipeline rank of each virtual stage, in order: round robin
    (interleaved), or a V (zb-v, dualpipev: the second chunk runs back up)."""
    if schedule in ("zb-v", "dualpipev"):
        return [v if v < pp else 2 * pp - 1 - v for v in range(pp * vpp)]
    return [v % pp for v in range(pp * vpp)]


def _makespan(binary: str, schedule: str, pp: int, m: int, vpp: int, t: tuple, work: list) -> float:
    """`trident schedule --simulate`'s makespan with each virtual stage's work,
    in the work's units: --layout weights a stage by its share over the mean
    weight, so the makespan is scaled back by that mean."""
    base = min(work)
    weights = [max(1, round(1000 * w / base)) for w in work]
    layout = ",".join(map(str, weights))
    args = [binary, "schedule", schedule, "--pp", str(pp), "--microbatches", str(m), "--vpp", str(vpp),
            "--tf", "%.6g" % t[0], "--tb", "%.6g" % t[1], "--tw", "%.6g" % t[2], "--layout", layout,
            "--simulate"]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    found = re.search(r"^makespan ([0-9.eE+-]+)", p.stdout, re.M)
    if p.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-200:]}")
    return float(found.group(1)) * (sum(weights) / len(weights)) * base / 1000


def _simulated(rf: RunFile, ranks: dict, slowest: int, measured: float) -> dict:
    """The step time the schedule simulator predicts without the slowest rank:
    every pipeline stage costs its slowest member's compute per step (its
    members meet in their cp, ep and dp groups), the slowest rank's stage once
    with it and once with the stage's other ranks only; the measured median
    step scaled by the ratio of the two makespans."""
    binary = os.environ.get("TRIDENT_BIN") or shutil.which("trident")
    if not binary:
        return {"why": "no trident binary to simulate with (put trident on PATH or set TRIDENT_BIN)"}
    cfg = rf.config()
    par, data = cfg.get("parallel", {}), cfg.get("data", {})
    pp, vpp = int(par.get("pp", 1)), int(par.get("vpp", 1))
    schedule, m = str(par.get("schedule", "1f1b")), int(data.get("num_microbatches", 1))
    if pp < 2:
        return {"why": "no pipeline (pp = 1): nothing for the schedule simulator"}
    per_step = lambda d, i: float(d["compute_s"][i]) / max(1, d["steps"])
    phase = [sum(per_step(d, i) for d in ranks.values()) for i in range(3)]  # forward, backward, weight
    if phase[0] <= 0:
        return {"why": "no forward time in the table"}
    t = (1.0, phase[1] / phase[0], phase[2] / phase[0])
    work = lambda d: sum(per_step(d, i) for i in range(3))
    stage_with, stage_without = [], []
    for s in range(pp):
        members = [d for d in ranks.values() if d["stage"] == s]
        others = [d for d in members if d["rank"] != slowest] or members
        stage_with.append(max([work(d) for d in members] or [0.0]))
        stage_without.append(max(work(d) for d in others) if others else 0.0)
    if min(stage_with + stage_without) <= 0:
        return {"why": "a pipeline stage has no compute in the table"}
    where = _virtual_stage_ranks(schedule, pp, vpp)
    try:
        with_s = _makespan(binary, schedule, pp, m, vpp, t, [stage_with[r] for r in where])
        without_s = _makespan(binary, schedule, pp, m, vpp, t, [stage_without[r] for r in where])
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        return {"why": f"the schedule simulator failed: {e}"}
    return {"schedule": schedule, "makespan_with": with_s, "makespan_without": without_s,
            "predicted_without_s": measured * without_s / with_s}


def analyse(rf: RunFile) -> dict:
    version = rf.attr("format_version", default=1)
    out: dict = {"file": rf.path, "format_version": version, "events": _straggler_events(rf)}
    if rf.has("/ranks/steps") and len(rf.h5["/ranks/steps"]):
        ranks = _per_rank_from_table(rf.h5["/ranks/steps"][()])
        out["source"] = "/ranks/steps"
    elif rf.has("/ranks/summary"):
        ranks = {}
        for row in rf.h5["/ranks/summary"][()]:
            r = int(row["rank"])
            ranks[r] = {"rank": r, "host": "", "stage": -1, "steps": len(rf.steps()),
                        "compute_s": np.array([float(row["compute_s"]), 0, 0, 0, 0, 0]),
                        "wait_s": np.asarray(row["comm_wait_s"], dtype=float), "waited_on_s": None,
                        "step_s": 0.0, "scores": [], "peers": {}}
        out["source"] = "/ranks/summary (no per-step table in this file: whole-run totals only)"
    else:
        raise AnalysisError(f"{rf.path}: has neither /ranks/steps nor /ranks/summary "
                            "(output.rank_stats_every = 0 and the run did not end normally)")
    topo = rf.topology_ranks()
    if topo is not None:
        for row in topo:
            d = ranks.get(int(row["rank"]))
            if d is not None:
                d["host"] = d["host"] or decode(row["hostname"])
                d["stage"] = int(row["pp"]) if d["stage"] < 0 else d["stage"]
    table = []
    for r in sorted(ranks):
        d = ranks[r]
        n = max(1, d["steps"])
        table.append({"rank": r, "host": d["host"], "stage": d["stage"], "steps": d["steps"],
                      "compute_per_step_s": dict(zip(PHASES, (d["compute_s"] / n).tolist())),
                      "wait_per_step_s": dict(zip(COMM_KINDS, (d["wait_s"] / n).tolist())),
                      "waited_on_s": d["waited_on_s"],
                      "max_score": max(d["scores"]) if d["scores"] else None,
                      "median_score": float(np.median(d["scores"])) if d["scores"] else None})
    out["ranks"] = table
    waited = [(r["waited_on_s"], r["rank"]) for r in table if r["waited_on_s"]]
    out["waited_on"] = [{"rank": r, "host": ranks[r]["host"], "seconds": s}
                        for s, r in sorted(waited, reverse=True) if s > 0]
    if out["source"] == "/ranks/steps":
        slowest = max(table, key=lambda x: x["median_score"] or 0)["rank"]
        out["slowest"] = slowest
        out["cost"] = _cost(rf, ranks, slowest)
        out["cost"]["simulated"] = _simulated(rf, ranks, slowest, out["cost"]["measured_step_s"])
    return out


def format_text(s: dict) -> str:
    lines = [f"{s['file']}: format_version {s['format_version']}, from {s['source']}"]
    hdr = "rank  host              stage  " + "  ".join(f"{p[:8]:>8}" for p in PHASES[:5]) + \
          "  " + "  ".join(f"w_{k:>4}" for k in COMM_KINDS) + "  waited_on  score"
    lines += ["per step, seconds (compute by phase, waits by kind):", hdr]
    for r in s["ranks"]:
        c, w = r["compute_per_step_s"], r["wait_per_step_s"]
        won = "" if r["waited_on_s"] is None else f"{r['waited_on_s']:9.3f}"
        sc = "" if r["median_score"] is None else f"{r['median_score']:5.2f}"
        lines.append(f"{r['rank']:4d}  {r['host'][:16]:16s}  {r['stage']:5d}  " +
                     "  ".join(f"{c[p]:8.4f}" for p in PHASES[:5]) + "  " +
                     "  ".join(f"{w[k]:6.4f}" for k in COMM_KINDS) + f"  {won:>9}  {sc:>5}")
    if s["waited_on"]:
        lines.append("waited on: " + ", ".join(f"rank {x['rank']} ({x['host']}) {x['seconds']:.3f} s"
                                               for x in s["waited_on"][:5]))
    for e in s["events"]:
        lines.append(f"straggler at step {e['step']}: rank {e['rank']}, {e['score']:.2f}x "
                     f"(threshold {e['threshold']:g}): {e['detail']}")
    if not s["events"]:
        lines.append("no straggler named during the run")
    cost = s.get("cost")
    if cost and cost.get("without_slowest_s") is not None:
        lines.append(f"slowest rank {s['slowest']}: median step {cost['measured_step_s']:.4f} s, "
                     f"about {cost['without_slowest_s']:.4f} s without its excess compute "
                     f"({cost['excess_per_step_s']:.4f} s per step)")
    elif cost:
        lines.append(f"slowest rank {s['slowest']}: {cost['why']}")
    sim = (cost or {}).get("simulated")
    if sim and "predicted_without_s" in sim:
        lines.append(f"schedule simulator ({sim['schedule']}, each stage at its slowest rank's compute): "
                     f"{sim['predicted_without_s']:.4f} s per step without rank {s['slowest']}'s excess "
                     f"(simulated step x{sim['makespan_without'] / sim['makespan_with']:.4f}); "
                     f"the straggler cost {cost['measured_step_s'] - sim['predicted_without_s']:.4f} s per step")
    elif sim:
        lines.append(f"schedule simulator: {sim['why']}")
    return "\n".join(lines)
