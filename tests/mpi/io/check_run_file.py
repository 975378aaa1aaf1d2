"""Checks a file from run_file_writer the way users' scripts read it: h5py.

Every value is recomputed from the writer's formulas; the exit code is the
verdict (0: all checks passed). Usage:
  check_run_file.py run FILE --ranks P --steps N --completed 0|1
  check_run_file.py bench FILE
"""
import argparse
import re
import sys

try:
    import h5py
    import numpy as np
except ImportError as e:  # fail loudly: a skipped check is not a pass
    sys.exit(f"check_run_file.py: FAILED: cannot import h5py/numpy ({e}); "
             "run scripts/install-deps.sh (it creates .venv with h5py and numpy) "
             "or set TRIDENT_PYTHON to a python3 that has them")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def tagged(S, seq, a, b):
    s, p, h, d = np.meshgrid(np.arange(S), np.arange(seq), np.arange(a), np.arange(b), indexing="ij")
    return ((s * 10000 + p * 100 + h * 10 + d) * 0.25).astype(np.float32)


def check_run(path, P, N, completed):
    import tomllib

    with h5py.File(path, "r") as f:
        a = f.attrs
        check(a["format"] == "trident-run", f"format = {a['format']!r}")
        check(isinstance(a["format"], str), "format is not read as str (must be a variable-length string)")
        check(int(a["format_version"]) == 3, "format_version != 3")
        check(len(a["trident_version"]) > 0, "trident_version empty")
        cfg = tomllib.loads(a["config_toml"])
        check(cfg["parallel"]["cp"] == P, "config_toml parallel.cp != world size")
        check(cfg["model"]["n_experts"] == 4 and cfg["model"]["moe_every"] == 2, "config_toml model table")
        check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", a["created_utc"]) is not None,
              f"created_utc {a['created_utc']!r} is not ISO 8601 UTC")
        check(int(a["world_size"]) == P, "world_size")
        check("slurm_job_id" in a, "slurm_job_id missing")
        check(int(a["completed"]) == completed, f"completed = {a['completed']}, expected {completed}")

        t = f["topology"].attrs
        for k, v in dict(nodes=1, ranks_per_node=P, nvlink_domain=P, pp=1, dp=1, cp=P, ep=1, vpp=1).items():
            check(int(t[k]) == v, f"/topology attribute {k} = {t[k]}, expected {v}")
        check(t["source"] == "override", "/topology source")
        ranks = f["topology/ranks"][()]
        check(ranks.shape == (P,), f"/topology/ranks shape {ranks.shape}")
        for col in ["rank", "node", "local_rank", "device", "pp", "dp", "cp", "ep", "hostname"]:
            check(col in ranks.dtype.names, f"/topology/ranks lacks column {col}")
        check(np.array_equal(ranks["rank"], np.arange(P)), "/topology/ranks rank column")
        check(np.array_equal(np.sort(ranks["cp"]), np.arange(P)), "/topology/ranks cp column (cp = world)")
        check(np.all(ranks["node"] == 0) and np.all(ranks["pp"] == 0), "/topology/ranks node/pp")
        check(all(len(h.decode()) > 0 for h in ranks["hostname"]), "/topology/ranks hostname empty")

        st = f["metrics/steps"][()]
        check(st.shape == (N,), f"/metrics/steps has {st.shape[0]} rows, expected {N}")
        i = np.arange(N)
        want = dict(step=i, loss=3.0 / (i + 1) + 0.125, aux_loss=0.01 * (i + 1), lr=1e-3 * (i + 1),
                    grad_norm=0.5 + i, step_time_s=0.25 + 0.001 * i, tokens_per_s=1000.0 * (i + 1),
                    bubble_fraction=0.0625 * (i + 1))
        for k, v in want.items():
            check(k in st.dtype.names and np.array_equal(st[k], v), f"/metrics/steps column {k}")
        cb = f["metrics/comm_bytes"]
        check(list(cb.attrs["columns"]) == ["cp", "pp", "ep", "dp"], "/metrics/comm_bytes columns attribute")
        check(np.array_equal(cb[()], 1024.0 * np.outer(i + 1, np.arange(1, 5))), "/metrics/comm_bytes values")
        et = f["metrics/expert_tokens"][()]
        l, e = np.arange(2), np.arange(4)
        want_et = 100 * i[:, None, None] + 10 * l[None, :, None] + e[None, None, :] + 1
        check(et.dtype == np.int64 and np.array_equal(et, want_et), "/metrics/expert_tokens values")

        ev = f["timeline/events"][()]
        check(ev.shape == (2 * P * N,), f"/timeline/events has {ev.shape[0]} rows, expected {2 * P * N}")
        if ev.shape == (2 * P * N,):
            step = np.repeat(i, 2 * P)
            rank = np.tile(np.repeat(np.arange(P), 2), N)
            j = np.tile([0, 1], P * N)
            check(np.array_equal(ev["step"], step), "/timeline/events step")
            check(np.array_equal(ev["rank"], rank), "/timeline/events rank")
            check([k.decode() for k in ev["kind"]] == ["F" if x == 0 else "B" for x in j], "/timeline/events kind")
            check(np.allclose(ev["t_begin_s"], step + 0.1 * rank + 0.01 * j, rtol=0, atol=1e-12),
                  "/timeline/events t_begin_s")
            check(np.allclose(ev["t_end_s"] - ev["t_begin_s"], 0.005, rtol=0, atol=1e-12), "/timeline/events t_end_s")

        if N >= 2:
            q = f["activations/step_1/layer_0/q"]
            check(list(q.attrs["sample_ids"]) == [3, 7], "activation sample_ids")
            check(q.dtype == np.float32, "activation dtype")
            check(np.array_equal(q[()], tagged(2, 2 * P * 4, 2, 3)), "activation not in global sequence order")
        if completed:
            s = f["ranks/summary"][()]
            check(s.shape == (P,), "/ranks/summary shape")
            check(np.array_equal(s["rank"], np.arange(P)), "/ranks/summary rank")
            check(np.array_equal(s["compute_s"], 1.0 + np.arange(P)), "/ranks/summary compute_s")
            check(np.array_equal(s["comm_wait_s"], 0.5 * np.arange(4)[None, :] + np.arange(P)[:, None]),
                  "/ranks/summary comm_wait_s")
        else:
            check("ranks" not in f, "a killed run should not have /ranks/summary")


def check_bench(path):
    with h5py.File(path, "r") as f:
        check(f.attrs["format"] == "trident-bench", "bench format")
        check(int(f.attrs["format_version"]) == 2, "bench format_version")
        check("--bench" in f.attrs["command"], "bench command attribute")
        check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", f.attrs["created_utc"]) is not None, "created_utc")
        g = f["bench/attention"]
        check(g.attrs["title"] == "attention forward, one rank", "title")
        check(list(g.attrs["notes"]) == ["speed-up flash/naive: 1.00", "machine: test"], "notes")
        check(list(g.attrs["columns"]) == ["seq", "impl", "time_ms", "GFLOP/s"], "columns")
        seq = g["seq"][()]
        check(seq.dtype == np.int64 and list(seq) == [128, 256, 512], "seq column")
        check([x.decode() for x in g["impl"][()]] == ["naive", "flash", "naive"], "impl column")
        check(np.array_equal(g["time_ms"][()], 0.5 * seq), "time_ms column")
        check(g["GFLOP_per_s"].dtype == np.float64 and np.array_equal(g["GFLOP_per_s"][()], 2.0 * seq + 0.25),
              "GFLOP/s column")
        check(g["GFLOP_per_s"].attrs["column"] == "GFLOP/s", "column attribute")
        c = f["bench/comm"]
        check(list(c["size_B"][()]) == [1024, 2048] and list(c["algbw_GB_per_s"][()]) == [1.5, 3.0], "comm table")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["run", "bench"])
    ap.add_argument("file")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--completed", type=int, default=1)
    a = ap.parse_args()
    try:
        if a.kind == "run":
            check_run(a.file, a.ranks, a.steps, a.completed)
        else:
            check_bench(a.file)
    except (KeyError, OSError) as e:
        failures.append(f"{type(e).__name__}: {e}")
    for x in failures:
        print(f"FAILED: {a.file}: {x}")
    if not failures:
        print(f"ok: {a.file}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
