"""`trident-analyze trace`: the timeline as a Chrome trace (opens in Perfetto).

One process per rank, one thread per kind of work (compute actions on one
track, sends and receives on another), complete events ("ph": "X") in
microseconds from the first event of the run.
"""
from __future__ import annotations

import json

import numpy as np

from .runfile import RunFile
from .summary import event_kinds


def to_chrome_trace(rf: RunFile) -> dict:
    ev = rf.events()
    kinds = event_kinds(ev)
    t0 = float(ev["t_begin_s"].min()) if len(ev) else 0.0
    out = []
    ranks = sorted(set(int(r) for r in ev["rank"]))
    for r in ranks:
        out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 0, "args": {"name": "compute"}})
        out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": 1, "args": {"name": "communication"}})
    for i in range(len(ev)):
        k = str(kinds[i])
        comm = k.startswith("SEND") or k.startswith("RECV")
        mb = int(ev["microbatch"][i])
        out.append({
            "name": f"{k}{mb}" if k in ("F", "B", "W") else k,
            "cat": "comm" if comm else "compute",
            "ph": "X",
            "pid": int(ev["rank"][i]),
            "tid": 1 if comm else 0,
            "ts": (float(ev["t_begin_s"][i]) - t0) * 1e6,
            "dur": max(0.0, float(ev["t_end_s"][i] - ev["t_begin_s"][i]) * 1e6),
            "args": {"step": int(ev["step"][i]), "stage": int(ev["stage"][i]),
                     "chunk": int(ev["chunk"][i]), "microbatch": mb},
        })
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"source": rf.path, "format": "trident-run timeline"}}


def write_trace(rf: RunFile, path: str) -> int:
    tr = to_chrome_trace(rf)
    with open(path, "w") as f:
        json.dump(tr, f)
    return sum(1 for e in tr["traceEvents"] if e["ph"] == "X")
