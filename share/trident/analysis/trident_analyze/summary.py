"""`trident-analyze summary`: what a run did and where its time went."""
from __future__ import annotations

import numpy as np

from .runfile import COMM_KINDS, RunFile, decode

# /ranks/summary's peak_<kind>_bytes columns (core/allocator.hpp's MemKind).
MEMORY_KINDS = ("parameters", "gradients", "optimizer", "activations", "communication", "workspace")

BUSY_KINDS = {"F", "B", "W"}


def event_kinds(ev) -> np.ndarray:
    return np.array([decode(k) for k in ev["kind"]])


def busy_per_rank_step(ev) -> dict:
    """{(rank, step): seconds spent in F/B/W actions}."""
    kinds = event_kinds(ev)
    busy: dict = {}
    for i in np.nonzero(np.isin(kinds, list(BUSY_KINDS)))[0]:
        key = (int(ev["rank"][i]), int(ev["step"][i]))
        busy[key] = busy.get(key, 0.0) + float(ev["t_end_s"][i] - ev["t_begin_s"][i])
    return busy


# The trainer's spans after the pipeline, in order (hdf5-layout.md).
AFTER_PIPELINE_KINDS = ("GUARD", "GRAD_REDUCE", "NORM", "UPDATE")


def after_pipeline_ms(ev, skip: int = 1) -> dict:
    """Per span kind after the pipeline, the median over the steps after the
    first `skip` of the slowest rank's span, in ms; {} without such spans."""
    kinds = event_kinds(ev)
    out = {}
    for k in AFTER_PIPELINE_KINDS:
        per_step: dict = {}
        for i in np.nonzero(kinds == k)[0]:
            step = int(ev["step"][i])
            if step >= skip:
                per_step[step] = max(per_step.get(step, 0.0), float(ev["t_end_s"][i] - ev["t_begin_s"][i]))
        if per_step:
            out[k] = 1e3 * float(np.median(list(per_step.values())))
    return out


def restarts(rf: RunFile) -> list:
    """The job's restarts inside its allocation (slurm/trident.sbatch with
    spares): the /events rows of kind "restart" this step's run file holds."""
    if not rf.has("/events"):
        return []
    out = []
    for e in rf.h5["/events"][()]:
        if decode(e["kind"]).strip("\0") != "restart":
            continue
        detail = decode(e["detail"]).strip("\0")  # cut at 96 bytes before format_version 3
        tier = "local" if "local tier" in detail else "shared" if "shared checkpoint" in detail else "none"
        out.append({"step": int(e["step"]), "seconds_to_first_step": float(e["value"]),
                    "steps_lost": float(e["reference"]), "resumed_from": tier, "detail": detail})
    return out


def checkpoint_saves(rf: RunFile):
    """The run's saves by tier: counts and median blocking seconds (None
    without /metrics/checkpoints or saves)."""
    ck = rf.checkpoints()
    if ck is None or len(ck) == 0:
        return None
    out = {}
    for tier, rows in (("shared", ck[ck["local"] == 0]), ("local", ck[ck["local"] != 0])):
        if len(rows):
            out[tier] = {"saves": int(len(rows)), "median_blocking_s": float(np.median(rows["blocking_s"]))}
    return out


def summarize(rf: RunFile) -> dict:
    out: dict = {"file": rf.path, "format_version": rf.format_version, "completed": rf.completed}
    out["trident_version"] = rf.attr("trident_version", default="")
    out["slurm_job_id"] = rf.attr("slurm_job_id", default="")
    out["world_size"] = rf.attr("world_size", default=None)
    topo = {}
    for k in ("nodes", "ranks_per_node", "nvlink_domain", "source", "pp", "dp", "cp", "ep", "vpp"):
        topo[k] = rf.attr(k, obj="/topology", default=None)
    out["topology"] = topo
    cfg = rf.config()
    out["config"] = {s: cfg.get(s, {}) for s in ("model", "data", "parallel", "train")} if cfg else {}
    out["restarts"] = restarts(rf)
    saves = checkpoint_saves(rf)
    if saves:
        out["checkpoints"] = saves

    steps = rf.steps()
    n = len(steps)
    out["steps"] = n
    if n == 0:
        out["note"] = "no completed steps"
        return out
    loss = np.asarray(steps["loss"], dtype=np.float64)
    best = int(np.argmin(loss))
    out["first_loss"] = float(loss[0])
    out["final_loss"] = float(loss[-1])
    out["best_loss"] = float(loss[best])
    out["best_step"] = int(steps["step"][best])
    st = np.asarray(steps["step_time_s"], dtype=np.float64)
    tps = np.asarray(steps["tokens_per_s"], dtype=np.float64)
    steady = slice(1, None) if n > 1 else slice(0, None)  # step 0 includes warm-up
    out["tokens_per_s"] = float(np.mean(tps[steady]))
    out["step_time_s"] = float(np.mean(st[steady]))
    total_time = float(np.sum(st))
    bubble = float(np.mean(np.asarray(steps["bubble_fraction"], dtype=np.float64)))

    split = {"bubble": bubble}
    if rf.has("/timeline/events"):
        ev = rf.events()
        busy = busy_per_rank_step(ev)
        ranks = sorted({r for r, _ in busy})
        if ranks and total_time > 0:
            split["compute"] = float(np.mean([sum(v for (r, _), v in busy.items() if r == rk) for rk in ranks]) / total_time)
        after = after_pipeline_ms(ev, 1 if n > 1 else 0)
        if after:
            out["after_pipeline_ms"] = after
    rs = rf.rank_summary()
    if rs is not None and total_time > 0 and "comm_wait_s" in rs.dtype.names:
        waits = np.asarray(rs["comm_wait_s"], dtype=np.float64).reshape(len(rs), -1)
        for i, k in enumerate(COMM_KINDS[: waits.shape[1]]):
            split[f"comm_wait_{k}"] = float(np.mean(waits[:, i]) / total_time)
        # cp (ring) and ep (all-to-all) waits happen inside F/B/W actions:
        # take them out so that compute + waits + bubble adds up to the step.
        if "compute" in split:
            inside = split.get("comm_wait_cp", 0.0) + split.get("comm_wait_ep", 0.0)
            split["compute"] = max(0.0, split["compute"] - inside)
        if "peak_rss_bytes" in rs.dtype.names:
            out["peak_rss_mb_max"] = float(np.max(rs["peak_rss_bytes"]) / 2**20)
        if "peak_alloc_bytes" in rs.dtype.names:
            out["peak_alloc_mb_max"] = float(np.max(rs["peak_alloc_bytes"]) / 2**20)
        # The training allocator's peak split by kind, on the rank whose
        # peak is highest (run files from before the split have no columns).
        kinds = [k for k in MEMORY_KINDS if f"peak_{k}_bytes" in rs.dtype.names]
        if kinds:
            totals = sum(np.asarray(rs[f"peak_{k}_bytes"], dtype=np.float64) for k in kinds)
            top = int(np.argmax(totals))
            out["peak_by_kind_mb"] = {"rank": int(rs["rank"][top]), **{
                k: float(rs[f"peak_{k}_bytes"][top] / 2**20) for k in kinds}}
    out["time_split"] = split

    cb = rf.comm_bytes()
    if cb is not None and cb.size:
        out["comm_mb_per_step"] = {k: float(np.mean(cb[:, i]) / 2**20) for i, k in enumerate(COMM_KINDS)}
        out["comm_mb_total"] = {k: float(np.sum(cb[:, i]) / 2**20) for i, k in enumerate(COMM_KINDS)}
    et = rf.expert_tokens()
    if et is not None and et.size:
        mean = et.mean(axis=2)
        imb = np.where(mean > 0, et.max(axis=2) / np.maximum(mean, 1e-12), 1.0)
        out["expert_imbalance"] = {"mean": float(imb.mean()), "last_step": [float(x) for x in imb[-1]]}
        out["expert_tokens_per_step"] = int(et[-1].sum())
    return out


def format_text(s: dict) -> str:
    L = []
    L.append(f"run file      {s['file']}{'' if s['completed'] else '   (INCOMPLETE: run did not finish)'}")
    if s.get("slurm_job_id"):
        L.append(f"slurm job     {s['slurm_job_id']}")
    t = s["topology"]
    L.append(f"topology      {t.get('nodes')} nodes x {t.get('ranks_per_node')} ranks (nvlink domain {t.get('nvlink_domain')}, {t.get('source')})")
    L.append(f"mesh          pp={t.get('pp')} dp={t.get('dp')} cp={t.get('cp')} ep={t.get('ep')} vpp={t.get('vpp')}  world={s.get('world_size')}")
    m = s.get("config", {}).get("model", {})
    if m:
        L.append(f"model         d_model={m.get('d_model')} layers={m.get('n_layers')} heads={m.get('n_heads')}/{m.get('n_kv_heads')} experts={m.get('n_experts')} top_k={m.get('top_k')}")
    p = s.get("config", {}).get("parallel", {})
    d = s.get("config", {}).get("data", {})
    if p or d:
        L.append(f"schedule      {p.get('schedule')}  cp_layout={p.get('cp_layout')}  seq_len={d.get('seq_len')}  microbatches={d.get('num_microbatches')}")
    L.append(f"steps         {s['steps']}")
    for r in s.get("restarts", []):
        lost = "?" if r["steps_lost"] < 0 else f"{r['steps_lost']:.0f}"
        L.append(f"restart       at step {r['step']}: from the {r['resumed_from']} checkpoint, {lost} step(s) lost, "
                 f"{r['seconds_to_first_step']:.1f} s from the failure to the first step ({r['detail']})")
    if s.get("checkpoints"):
        L.append("checkpoints   " + ", ".join(f"{v['saves']} {k} (median {v['median_blocking_s']:.3f} s blocking)"
                                              for k, v in s["checkpoints"].items()))
    if s["steps"]:
        L.append(f"loss          first {s['first_loss']:.4f}  final {s['final_loss']:.4f}  best {s['best_loss']:.4f} (step {s['best_step']})")
        L.append(f"throughput    {s['tokens_per_s']:.0f} tokens/s, {s['step_time_s'] * 1e3:.1f} ms/step (mean after the first step)")
        sp = s.get("time_split", {})
        pct = lambda k: f"{100 * sp[k]:.1f}%" if k in sp else "n/a"  # noqa: E731
        # compute + cp/ep waits (inside F/B/W) + bubble = 100%; pp and dp
        # waits fall outside the actions, i.e. inside the bubble.
        L.append(f"time split    compute {pct('compute')} | waits inside F/B/W: cp {pct('comm_wait_cp')}, "
                 f"ep {pct('comm_wait_ep')} | bubble {pct('bubble')} (pp wait {pct('comm_wait_pp')}, "
                 f"dp wait {pct('comm_wait_dp')})")
        if "after_pipeline_ms" in s:
            L.append("after the pipeline  " + ", ".join(f"{k} {v:.2f} ms" for k, v in s["after_pipeline_ms"].items())
                     + " (slowest rank, median over steps after the first)")
        if "comm_mb_per_step" in s:
            L.append("comm / step   " + "  ".join(f"{k} {v:.2f} MB" for k, v in s["comm_mb_per_step"].items()))
        if "expert_imbalance" in s:
            ei = s["expert_imbalance"]
            L.append(f"experts       imbalance max/mean {ei['mean']:.3f} (mean over steps and layers); last step per layer "
                     + ", ".join(f"{x:.2f}" for x in ei["last_step"]))
        if "peak_rss_mb_max" in s:
            alloc = f", allocator {s['peak_alloc_mb_max']:.1f} MB" if "peak_alloc_mb_max" in s else ""
            L.append(f"memory        peak RSS {s['peak_rss_mb_max']:.0f} MB{alloc} (max over ranks)")
        if "peak_by_kind_mb" in s:
            pk = dict(s["peak_by_kind_mb"])
            rank = pk.pop("rank")
            L.append(f"peak by kind  rank {rank}: " + ", ".join(f"{k} {v:.2f} MB" for k, v in pk.items())
                     + f" (= {sum(pk.values()):.2f} MB, the allocator's peak)")
    return "\n".join(L)
