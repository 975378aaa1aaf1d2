"""`trident-analyze compare A B`: step-by-step difference of two runs.

Typical use: a parallel run against the one-rank run of the same config
("parallel equals serial"), or a resumed run against an uninterrupted one.
"""
from __future__ import annotations

import numpy as np

from .runfile import AnalysisError, RunFile

METRICS = ["loss", "aux_loss", "z_loss", "grad_norm", "lr"]


def rel_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    scale = np.maximum(np.abs(b), 1e-12)
    return np.abs(a - b) / scale


def compare(a: RunFile, b: RunFile) -> dict:
    sa, sb = a.steps(), b.steps()
    common = np.intersect1d(sa["step"], sb["step"])
    if len(common) == 0:
        raise AnalysisError(f"{a.path} and {b.path} share no steps")
    ia = np.searchsorted(sa["step"], common)
    ib = np.searchsorted(sb["step"], common)
    res = {"a": a.path, "b": b.path, "steps": [int(s) for s in common],
           "only_in_a": int(len(sa) - len(common)), "only_in_b": int(len(sb) - len(common)), "metrics": {}}
    for m in METRICS:
        if m not in sa.dtype.names or m not in sb.dtype.names:
            continue
        va = np.asarray(sa[m][ia], dtype=np.float64)
        vb = np.asarray(sb[m][ib], dtype=np.float64)
        rd = rel_diff(va, vb)
        res["metrics"][m] = {"a": va.tolist(), "b": vb.tolist(), "rel": rd.tolist(),
                             "max_rel": float(rd.max()) if len(rd) else 0.0}
    return res


def format_text(res: dict) -> str:
    L = [f"A = {res['a']}", f"B = {res['b']}",
         f"{len(res['steps'])} common steps" + (f" ({res['only_in_a']} only in A, {res['only_in_b']} only in B)"
                                                 if res["only_in_a"] or res["only_in_b"] else "")]
    loss = res["metrics"].get("loss")
    if loss:
        L.append(f"{'step':>6} {'loss A':>14} {'loss B':>14} {'rel diff':>10}")
        for s, x, y, r in zip(res["steps"], loss["a"], loss["b"], loss["rel"]):
            L.append(f"{s:>6} {x:>14.8f} {y:>14.8f} {r:>10.2e}")
    L.append("max relative difference: " + "  ".join(f"{m} {v['max_rel']:.3e}" for m, v in res["metrics"].items()))
    return "\n".join(L)
