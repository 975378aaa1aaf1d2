"""trident-analyze reads run files of every format_version it knows
(share/trident/hdf5-layout.md) and refuses a newer one with one line.

The files are made here with h5py as the writers made them: version 2 as
issue 47 first wrote it (a 96-byte /events detail that cut a restart's path,
no `local` member in /metrics/checkpoints) and version 3 (a 1024-byte detail,
`local`). No trident run; the package is this tree's
(share/trident/analysis), not an installed copy.
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", os.path.join(HERE, "..", "..")),
                       "share", "trident", "analysis")
PATH = "/dev/shm/trident-spare/trident-50/n1/ckpt_step_00000005.h5"
DETAIL = "node n2 left out; resumed from the local tier: " + PATH


def make_run(path, version, detail_bytes, local_column):
    step_t = np.dtype([("step", "<i8"), ("loss", "<f8"), ("aux_loss", "<f8"), ("z_loss", "<f8"),
                       ("lr", "<f8"), ("grad_norm", "<f8"), ("step_time_s", "<f8"),
                       ("tokens_per_s", "<f8"), ("bubble_fraction", "<f8")])
    ck_fields = [("step", "<i8"), ("blocking_s", "<f8"), ("write_s", "<f8"), ("bytes", "<i8"),
                 ("slowest_rank", "<i4"), ("async", "<i4")] + ([("local", "<i4")] if local_column else [])
    ev_t = np.dtype([("step", "<i8"), ("kind", "S16"), ("rank", "<i4"), ("value", "<f8"),
                     ("reference", "<f8"), ("detail", "S%d" % detail_bytes)])
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "trident-run"
        f.attrs["format_version"] = np.int64(version)
        f.attrs["completed"] = np.int64(1)
        steps = np.zeros(7, step_t)
        steps["step"] = np.arange(5, 12)
        steps["loss"] = np.linspace(2.9, 2.8, 7)
        steps["step_time_s"] = 0.5
        f.create_dataset("metrics/steps", data=steps)
        ck = np.zeros(3, np.dtype(ck_fields))
        ck["step"] = [6, 8, 12]
        ck["blocking_s"] = [0.1, 0.3, 0.2]
        if local_column:
            ck["local"] = [1, 0, 0]
        f.create_dataset("metrics/checkpoints", data=ck)
        ev = np.zeros(1, ev_t)
        ev[0] = (5, b"restart", -1, 37.9, 0.0, DETAIL.encode()[: detail_bytes - 1])
        f.create_dataset("events", data=ev)


def summary(path, *extra):
    env = dict(os.environ, PYTHONPATH=PACKAGE)
    return subprocess.run([sys.executable, "-m", "trident_analyze", "summary", path, *extra],
                          capture_output=True, text=True, timeout=120, env=env)


def test_version_2_file_loads(tmp_path):
    path = str(tmp_path / "v2.h5")
    make_run(path, 2, 96, False)
    r = summary(path)
    assert r.returncode == 0, r.stderr
    assert "restart       at step 5: from the local checkpoint, 0 step(s) lost, 37.9 s" in r.stdout
    assert "checkpoints   3 shared (median 0.200 s blocking)" in r.stdout, r.stdout
    s = json.loads(summary(path, "--json").stdout)
    assert s["format_version"] == 2
    assert s["restarts"][0]["detail"] == DETAIL[:95]  # what version 2 kept
    assert s["checkpoints"] == {"shared": {"saves": 3, "median_blocking_s": 0.2}}


def test_version_3_file_keeps_the_whole_detail(tmp_path):
    path = str(tmp_path / "v3.h5")
    make_run(path, 3, 1024, True)
    r = summary(path)
    assert r.returncode == 0, r.stderr
    assert "(" + DETAIL + ")" in r.stdout, r.stdout
    assert "checkpoints   2 shared (median 0.250 s blocking), 1 local (median 0.100 s blocking)" in r.stdout
    s = json.loads(summary(path, "--json").stdout)
    assert s["format_version"] == 3 and s["restarts"][0]["detail"] == DETAIL


def test_newer_version_is_refused_in_one_line(tmp_path):
    path = str(tmp_path / "v4.h5")
    make_run(path, 4, 1024, True)
    r = summary(path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "format_version 4" in lines[0] and "reads 1 to 3" in lines[0], r.stderr
