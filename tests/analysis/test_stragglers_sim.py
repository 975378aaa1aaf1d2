"""trident-analyze stragglers' simulated cost on small h5py-made run files
(pp = 2, 1f1b): the schedule simulator (`trident schedule --simulate`, the
binary of $TRIDENT_BIN) predicts a shorter step without a slow last-stage
rank, the same step when no rank is slower than its stage, and the report
says why when there is no binary."""
import os
import sys

import h5py
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", ""), "share", "trident", "analysis"))
from trident_analyze import stragglers  # noqa: E402
from trident_analyze.runfile import RunFile  # noqa: E402

BIN = os.environ.get("TRIDENT_BIN", "")
ROW = np.dtype([("step", "<i8"), ("rank", "<i8"), ("host", "S16"), ("stage", "<i8"), ("steps", "<i8"),
                ("compute_s", "<f8", (6,)), ("wait_s", "<f8", (4,)), ("waited_on_s", "<f8"),
                ("step_s", "<f8"), ("score", "<f8"), ("peer", "<i8"), ("peer_wait_s", "<f8")])


def make_run(path, slow_factor):
    """4 ranks, stages 0 (ranks 0, 1) and 1 (ranks 2, 3); rank 3's forward
    and backward take slow_factor times the others'."""
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "trident-run"
        f.attrs["format_version"] = np.int64(2)
        f.attrs["config_toml"] = ('[parallel]\npp = 2\nschedule = "1f1b"\n'
                                  "[data]\nnum_microbatches = 4\n")
        st = np.zeros(10, dtype=[("step", "<i8"), ("step_time_s", "<f8")])
        st["step"] = np.arange(10)
        st["step_time_s"] = 1.0
        f["metrics/steps"] = st
        rows = np.zeros(4, dtype=ROW)
        for r in range(4):
            k = slow_factor if r == 3 else 1.0
            rows[r] = (0, r, b"h%d" % r, r // 2, 10, [1.0 * k, 2.0 * k, 0, 0.1, 0.01, 0], [0, 0.2, 0, 0.1],
                       0.0, 1.0, k, -1, 0.0)
        f["ranks/steps"] = rows


@pytest.mark.skipif(not BIN, reason="TRIDENT_BIN is not set (ctest sets it)")
def test_a_slow_last_stage_rank_costs_what_the_simulator_says(tmp_path):
    p = str(tmp_path / "slow.h5")
    make_run(p, 2.0)
    with RunFile(p) as rf:
        res = stragglers.analyse(rf)
    sim = res["cost"]["simulated"]
    assert res["slowest"] == 3
    assert sim["schedule"] == "1f1b"
    # stage 1 at half the pace: without it the step is shorter, but not by more than that stage's whole excess
    assert 0.5 < sim["predicted_without_s"] < 0.95
    assert "s per step without rank 3's excess" in stragglers.format_text(res)


@pytest.mark.skipif(not BIN, reason="TRIDENT_BIN is not set (ctest sets it)")
def test_no_slower_rank_costs_nothing(tmp_path):
    p = str(tmp_path / "even.h5")
    make_run(p, 1.0)
    with RunFile(p) as rf:
        res = stragglers.analyse(rf)
    assert res["cost"]["simulated"]["predicted_without_s"] == pytest.approx(1.0, rel=1e-3)


def test_without_a_binary_the_report_says_why(tmp_path, monkeypatch):
    p = str(tmp_path / "slow.h5")
    make_run(p, 2.0)
    monkeypatch.setenv("TRIDENT_BIN", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    with RunFile(p) as rf:
        res = stragglers.analyse(rf)
    assert "no trident binary" in res["cost"]["simulated"]["why"]
    assert "schedule simulator: no trident binary" in stragglers.format_text(res)
