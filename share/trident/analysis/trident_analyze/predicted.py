"""`trident-analyze predicted`: a run's measured step time, time split and peak
memory next to the planner's prediction of the same mesh.

The prediction is the root attribute `prediction` (JSON, written by
`trident run --machine FILE`), or a file given with --prediction (the output
of `trident plan CONFIG ... --machine FILE --format json`). Measured values:
the median step time and tokens/s over the steps after the first `skip`
(warm-up), the mean bubble fraction, the time split of `summary`, and the
largest peak memory over ranks (the allocator's peak where the run recorded
one, compared with the predicted bytes the allocator holds; else the peak
resident set, compared with the predicted total; the field is named in the
output). With ep > 1, the routing imbalance the prediction assumed (the
busiest EP rank's routed rows over the mean) next to the run's: from
/metrics/expert_tokens, each EP rank holding a contiguous block of experts,
the mean over the steps used and the MoE layers (the loads are summed over
the data-parallel replicas, which evens them out a little). With the
trainer's spans after the pipeline in the timeline, the longest rank's work
after its pipeline (GUARD's begin to UPDATE's end, median over steps) next to
the prediction's exposed reduction plus its other costs.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from . import summary
from .runfile import AnalysisError, RunFile

# Fields of /ranks/summary that hold a rank's peak memory, best first.
MEMORY_FIELDS = ("peak_alloc_bytes", "peak_device_bytes", "peak_rss_bytes")


@dataclass
class Row:
    quantity: str
    predicted: float
    measured: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured if self.measured else float("nan")


def load_prediction(rf: RunFile, path: str | None) -> dict:
    if path:
        try:
            with open(path) as f:
                p = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise AnalysisError(f"{path}: not a readable prediction (trident plan --format json): {e}") from e
        p = p.get("prediction", p)  # `plan --format json` nests it; a bare prediction is accepted
    else:
        text = rf.attr("prediction", default="")
        if not text:
            raise AnalysisError(f"{rf.path}: has no root attribute prediction "
                                "(run with --machine FILE, or pass --prediction FILE)")
        try:
            p = json.loads(text)
        except json.JSONDecodeError as e:
            raise AnalysisError(f"{rf.path}: root attribute prediction is not JSON: {e}") from e
    if "step_time_s" not in p:
        raise AnalysisError(f"{path or rf.path}: the prediction has no step_time_s")
    return p


def measured_memory(rf: RunFile) -> tuple[float, str]:
    rs = rf.rank_summary()
    if rs is None:
        return float("nan"), "none"
    for name in MEMORY_FIELDS:
        if name in rs.dtype.names and float(np.max(rs[name])) > 0:
            return float(np.max(rs[name])), name
    return float("nan"), "none"


def measured_imbalance(rf: RunFile, ep: int, skip: int) -> float:
    """Busiest EP rank's routed rows over the mean, averaged over steps and MoE layers."""
    et = rf.expert_tokens()
    if et is None or ep <= 1 or et.shape[0] <= skip or et.shape[2] % ep:
        return float("nan")
    per_rank = et[skip:].reshape(et.shape[0] - skip, et.shape[1], ep, et.shape[2] // ep).sum(axis=3)
    mean = per_rank.mean(axis=2)
    ok = mean > 0
    return float(np.mean(per_rank.max(axis=2)[ok] / mean[ok])) if ok.any() else float("nan")


def measured_after_pipeline(rf: RunFile, skip: int) -> float:
    """Median over the steps after `skip` of the longest rank's work after its
    pipeline: from its GUARD span's begin to its UPDATE span's end. NaN for a
    run without those spans (timeline off, or written before 2026-12-02)."""
    if not rf.has("/timeline/events"):
        return float("nan")
    ev = rf.events()
    kinds = summary.event_kinds(ev)
    begin = {(int(e["step"]), int(e["rank"])): float(e["t_begin_s"]) for e in ev[kinds == "GUARD"]}
    end = {(int(e["step"]), int(e["rank"])): float(e["t_end_s"]) for e in ev[kinds == "UPDATE"]}
    per_step: dict[int, float] = {}
    for key, b in begin.items():
        if key in end and key[0] >= skip:
            per_step[key[0]] = max(per_step.get(key[0], 0.0), end[key] - b)
    return float(np.median(list(per_step.values()))) if per_step else float("nan")


def compare(rf: RunFile, prediction_path: str | None = None, skip: int = 1) -> dict:
    p = load_prediction(rf, prediction_path)
    steps = rf.steps()
    if len(steps) <= skip:
        raise AnalysisError(f"{rf.path}: {len(steps)} steps, need more than --skip {skip}")
    st = np.asarray(steps["step_time_s"], dtype=np.float64)[skip:]
    tps = np.asarray(steps["tokens_per_s"], dtype=np.float64)[skip:]
    bubble = np.asarray(steps["bubble_fraction"], dtype=np.float64)[skip:]
    rows = [Row("step_time_s", p["step_time_s"], float(np.median(st))),
            Row("tokens_per_s", p["tokens_per_s"], float(np.median(tps))),
            Row("bubble_fraction", p["bubble_fraction"], float(np.mean(bubble)))]
    mem, field = measured_memory(rf)
    pm = p["memory_bytes"]
    # An allocator's peak is compared with what the prediction puts in the
    # allocator (predictions before that split carry the total only).
    in_allocator = field in ("peak_alloc_bytes", "peak_device_bytes") and "allocator" in pm
    rows.append(Row("peak_memory_bytes", pm["allocator"] if in_allocator else pm["total"], mem))
    if p.get("ep", 1) > 1 and "moe_imbalance" in p:
        rows.append(Row("moe_imbalance", p["moe_imbalance"], measured_imbalance(rf, p["ep"], skip)))
    after = measured_after_pipeline(rf, skip)
    if not np.isnan(after) and "time_split_s" in p:
        # what the planner puts after the pipeline: the exposed reduction and
        # the rest (agreements, the update, the fixed step cost)
        ts = p["time_split_s"]
        rows.append(Row("after_pipeline_s", ts.get("dp", 0.0) + ts.get("other", 0.0), after))
    split = summary.summarize(rf).get("time_split", {})
    step = p["step_time_s"]
    pred_split = {k: v / step for k, v in p.get("time_split_s", {}).items()}
    split_rows = [Row(f"share_{k}", pred_split.get(k, float("nan")), split.get(m, float("nan")))
                  for k, m in (("compute", "compute"), ("cp", "comm_wait_cp"), ("ep", "comm_wait_ep"),
                               ("bubble", "bubble"), ("dp", "comm_wait_dp"))]
    mesh = {k: p.get(k) for k in ("pp", "vpp", "cp", "ep", "dp", "schedule", "micro_batch_size", "num_microbatches")}
    return {"file": rf.path, "mesh": mesh, "steps_used": int(len(st)), "memory_field": field,
            "rows": [dict(asdict(r), ratio=r.ratio) for r in rows + split_rows]}


def format_text(res: dict) -> str:
    m = res["mesh"]
    lines = [f"{res['file']}: pp={m['pp']} vpp={m['vpp']} cp={m['cp']} ep={m['ep']} dp={m['dp']} "
             f"{m['schedule']} mbs={m['micro_batch_size']} m={m['num_microbatches']}; "
             f"{res['steps_used']} steps; memory from {res['memory_field']}",
             f"{'quantity':<20} {'predicted':>12} {'measured':>12} {'pred/meas':>10}"]
    for r in res["rows"]:
        lines.append(f"{r['quantity']:<20} {r['predicted']:>12.5g} {r['measured']:>12.5g} {r['ratio']:>10.3f}")
    return "\n".join(lines)
