"""trident-analyze against run files produced here by real trident runs.

Two small runs of one model: on 4 ranks (pp=2, cp=2, ep=2: timeline, ring
attention, experts, activation capture) and on 1 rank; the 1-rank run twice.
Needs TRIDENT_BIN and TRIDENT_MPIRUN (set by ctest) and the analysis package
(installed into .venv by scripts/install-deps.sh).
"""
import json
import os
import shlex
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

BIN = os.environ.get("TRIDENT_BIN")
MPIRUN = shlex.split(os.environ.get("TRIDENT_MPIRUN", ""))

COMMON = [
    "model.vocab_size=32", "model.d_model=32", "model.n_layers=2", "model.n_heads=4", "model.n_kv_heads=2",
    "model.ffn_hidden=32", "model.n_experts=4", "model.top_k=2",
    "data.seq_len=32", "data.micro_batch_size=1", "data.num_microbatches=4",
    "train.steps=3", "train.warmup_steps=1",
    "output.activation_steps=[1]", "output.activation_layers=[0,1]", "output.activation_samples=[0,2]",
]


def base_config(tmp):
    """An empty config: defaults everywhere, the test's keys come by --set."""
    path = os.path.join(tmp, "base.toml")
    with open(path, "w") as f:
        f.write("# defaults; every key of the test comes by --set\n")
    return path


def trident_run(tmp, name, np_, extra):
    if not BIN or not MPIRUN:
        pytest.fail("TRIDENT_BIN and TRIDENT_MPIRUN must be set (run through ctest)")
    out = os.path.join(tmp, f"{name}.h5")
    sets = []
    for kv in COMMON + extra + [f"output.checkpoint_dir={os.path.join(tmp, name + '-ckpt')}"]:
        sets += ["--set", kv]
    cmd = MPIRUN + ["-np", str(np_), BIN, "run", base_config(tmp)] + sets + ["--output", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert os.path.exists(out)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("runs"))
    par = trident_run(tmp, "par4", 4, ["parallel.pp=2", "parallel.cp=2", "parallel.ep=2",
                                       "parallel.cp_layout=zigzag"])
    ser = trident_run(tmp, "ser1", 1, [])
    ser2 = trident_run(tmp, "ser1b", 1, [])
    return {"tmp": tmp, "par": par, "ser": ser, "ser2": ser2}


def analyze(*args):
    return subprocess.run([sys.executable, "-m", "trident_analyze", *args], capture_output=True, text=True, timeout=300)


def test_summary_text_and_json(runs):
    r = analyze("summary", runs["par"])
    assert r.returncode == 0, r.stderr
    assert "pp=2" in r.stdout and "cp=2" in r.stdout and "steps         3" in r.stdout
    r = analyze("summary", runs["par"], "--json")
    assert r.returncode == 0, r.stderr
    import json
    s = json.loads(r.stdout)
    assert s["steps"] == 3
    assert s["topology"]["pp"] == 2 and s["topology"]["cp"] == 2
    assert s["comm_mb_total"]["cp"] > 0 and s["comm_mb_total"]["pp"] > 0 and s["comm_mb_total"]["ep"] > 0
    assert 0.0 <= s["time_split"]["bubble"] < 1.0
    # dropless: every token goes to top_k experts
    tokens = 32 * 1 * 4  # seq_len * micro_batch_size * num_microbatches (dp = 1)
    assert s["expert_tokens_per_step"] == tokens * 2 * 2  # top_k = 2, two MoE layers


def test_peak_memory_split_by_kind(runs):
    """The allocator's peak splits into kinds that add up to it, and the
    summary shows the split of the rank with the highest peak."""
    kinds = ("parameters", "gradients", "optimizer", "activations", "communication", "workspace")
    with h5py.File(runs["par"], "r") as f:
        rs = f["/ranks/summary"][()]
    for row in rs:
        parts = [float(row[f"peak_{k}_bytes"]) for k in kinds]
        assert sum(parts) == float(row["peak_alloc_bytes"])
        # AdamW holds two moments per parameter and the step's gradients one
        assert parts[2] == 2 * parts[1] and parts[1] > 0 and parts[3] > 0
    r = analyze("summary", runs["par"])
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("peak by kind")]
    assert len(line) == 1 and "activations" in line[0] and "optimizer" in line[0], r.stdout
    r = analyze("summary", runs["par"], "--json")
    import json
    pk = json.loads(r.stdout)["peak_by_kind_mb"]
    top = max(rs, key=lambda row: sum(float(row[f"peak_{k}_bytes"]) for k in kinds))
    assert pk["rank"] == int(top["rank"])
    assert abs(pk["activations"] - top["peak_activations_bytes"] / 2**20) < 1e-9


def test_expert_tokens_sum_dropless(runs):
    with h5py.File(runs["par"], "r") as f:
        et = f["/metrics/expert_tokens"][()]
    tokens = 32 * 1 * 4
    assert et.shape[0] == 3 and et.shape[2] == 4
    for step in range(3):
        for layer in range(et.shape[1]):
            assert et[step, layer].sum() == tokens * 2


def test_plot_all_figures(runs, tmp_path):
    out = tmp_path / "fig"
    r = analyze("plot", runs["par"], "--out", str(out))
    assert r.returncode == 0, r.stderr
    for name in ["loss", "pipeline", "cp_balance", "experts", "comm"]:
        p = out / f"{name}.png"
        assert p.exists(), f"{name}.png missing; stderr: {r.stderr}"
        assert p.stat().st_size > 5000, f"{name}.png looks empty"
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_trace(runs, tmp_path):
    out = tmp_path / "trace.json"
    r = analyze("trace", runs["par"], "-o", str(out))
    assert r.returncode == 0, r.stderr
    import json
    tr = json.loads(out.read_text())
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    names = {e["name"][0] for e in xs}
    assert {"F", "B"} <= names
    assert {e["pid"] for e in xs} == {0, 1, 2, 3}
    assert all(e["dur"] >= 0 for e in xs)


def test_timeline_spans_after_the_pipeline(runs):
    # Every rank, every step: GUARD, GRAD_REDUCE, NORM, UPDATE once each, back
    # to back in that order, after the rank's last F/B/W of the step.
    with h5py.File(runs["par"]) as f:
        ev = f["/timeline/events"][()]
    kinds = np.array([k.decode() for k in ev["kind"]])
    after = ["GUARD", "GRAD_REDUCE", "NORM", "UPDATE"]
    for step in range(3):
        for rank in range(4):
            mine = (ev["step"] == step) & (ev["rank"] == rank)
            spans = sorted(((float(ev["t_begin_s"][i]), float(ev["t_end_s"][i]), kinds[i])
                            for i in np.nonzero(mine & np.isin(kinds, after))[0]))
            assert [k for _, _, k in spans] == after, (step, rank, spans)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans  # contiguous
            assert all(e >= b for b, e, _ in spans)
            last = float(ev["t_end_s"][mine & np.isin(kinds, ["F", "B", "W"])].max())
            assert spans[0][0] >= last, (step, rank)
    # the summary shows them: the slowest rank's span, median over steps 1-2
    r = analyze("summary", runs["par"], "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["after_pipeline_ms"]
    assert list(got) == after
    for k in after:
        want = [max(float(ev["t_end_s"][i] - ev["t_begin_s"][i]) for i in np.nonzero((ev["step"] == s) & (kinds == k))[0])
                for s in (1, 2)]
        assert got[k] == pytest.approx(1e3 * float(np.median(want))), k
    assert "after the pipeline" in analyze("summary", runs["par"]).stdout


def test_compare_identical_runs_is_zero(runs):
    r = analyze("compare", runs["ser"], runs["ser2"], "--tolerance", "0", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    res = json.loads(r.stdout.split("\nPASS")[0])
    assert res["metrics"]["loss"]["max_rel"] == 0.0


def test_compare_parity_run_below_1e4(runs):
    r = analyze("compare", runs["par"], runs["ser"], "--tolerance", "1e-4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout


def test_z_loss_recorded_apart_from_aux_loss(runs):
    """aux_loss is the load-balancing loss alone; the router z-loss is z_loss."""
    zrun = trident_run(runs["tmp"], "ser1z", 1, ["model.z_loss_coef=0.01"])
    with h5py.File(runs["ser"], "r") as f0, h5py.File(zrun, "r") as fz:
        off, on = f0["metrics/steps"][()], fz["metrics/steps"][()]
    assert (off["z_loss"] == 0).all()
    assert (on["z_loss"] > 0).all()
    # Step 0 starts from the same weights: the same load-balancing loss.
    assert on["aux_loss"][0] == off["aux_loss"][0] > 0
    r = analyze("compare", zrun, runs["ser"], "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    assert res["metrics"]["z_loss"]["b"] == [0.0, 0.0, 0.0]


def test_attention_check_passes_on_real_capture(runs):
    for layer in (0, 1):
        r = analyze("attention", runs["par"], "--step", "1", "--layer", str(layer))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "PASS" in r.stdout


def test_attention_check_fails_on_tampered_capture(runs, tmp_path):
    bad = tmp_path / "tampered.h5"
    shutil.copy(runs["par"], bad)
    with h5py.File(bad, "r+") as f:
        ds = f["/activations/step_1/layer_0/attn_out"]
        a = ds[()]
        a[0, a.shape[1] // 2, 0, :] += 0.5  # one token, one head
        ds[...] = a
    r = analyze("attention", str(bad), "--step", "1", "--layer", "0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL" in r.stdout


def test_truncated_file_gives_clear_message(runs, tmp_path):
    bad = tmp_path / "truncated.h5"
    data = open(runs["par"], "rb").read()
    bad.write_bytes(data[: len(data) // 3])
    r = analyze("summary", str(bad))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert "truncated" in r.stderr and str(bad) in r.stderr


def test_missing_parts_are_named(runs):
    r = analyze("attention", runs["par"], "--step", "2", "--layer", "0")
    assert r.returncode == 2
    assert "has no /activations/step_2/layer_0/q" in r.stderr and "Traceback" not in r.stderr


def test_killed_run_is_readable(runs, tmp_path):
    """A run killed after some steps: completed steps readable, summary says incomplete."""
    out = str(tmp_path / "killed.h5")
    sets = []
    for kv in COMMON + ["train.steps=1000", f"output.checkpoint_dir={tmp_path / 'ck'}"]:
        sets += ["--set", kv]
    p = subprocess.Popen(MPIRUN + ["-np", "1", BIN, "run", base_config(str(tmp_path))] + sets + ["--output", out],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    import time
    deadline = time.time() + 120
    seen = 0
    for line in p.stdout:
        if line.lstrip().startswith("step"):
            seen += 1
        if seen >= 4 or time.time() > deadline:
            break
    subprocess.run(["pkill", "-KILL", "-f", out])
    p.kill()
    p.wait(timeout=30)
    r = analyze("summary", out, "--json")
    assert r.returncode == 0, r.stderr
    import json
    s = json.loads(r.stdout)
    assert s["completed"] is False
    assert s["steps"] >= 3


def test_bench_file_tables(runs, tmp_path):
    out = str(tmp_path / "ring.h5")
    cmd = MPIRUN + ["-np", "2", BIN, "bench", "ring", "--causal", "--seq-per-rank", "64", "--iters", "2",
                    "--output", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    r = analyze("bench", out, "--table", "ring", "ring_steps", "--json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)  # strict JSON: unmeasured cells are null, not NaN
    assert set(b["tables"]) == {"ring", "ring_steps"}
    assert "bench ring" in b["command"]
    ring = b["tables"]["ring"]
    col = {h: i for i, h in enumerate(ring["columns"])}
    rows = {row[col["layout"]]: row for row in ring["rows"]}
    assert set(rows) == {"contiguous", "zigzag"}
    assert rows["zigzag"][col["balance_flops"]] == 1.0
    assert rows["zigzag"][col["one_rank_busy_ms"]] is None  # no --baseline
    steps = b["tables"]["ring_steps"]
    # 2 layouts x 2 ranks x 2 iterations x 2cp steps
    assert len(steps["rows"]) == 2 * 2 * 2 * 4
    with h5py.File(out, "r") as f:  # the same numbers as the file holds
        assert np.allclose([row[col["balance_paired"]] for row in ring["rows"]],
                           f["bench/ring/balance_paired"][()])
    r = analyze("bench", out)
    assert r.returncode == 0 and "[ring_step_kinds]" in r.stdout and "balance_paired" in r.stdout
    r = analyze("bench", out, "--table", "bogus")
    assert r.returncode == 2 and "--table bogus: no such table" in r.stderr
    r = analyze("bench", runs["par"])
    assert r.returncode == 2 and "not a trident bench file" in r.stderr and "Traceback" not in r.stderr
