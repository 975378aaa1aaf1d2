"""trident-analyze predicted on small h5py-made run files: the medians, the
memory field chosen, the ratios, and a file without a prediction refused."""
import json
import os
import sys

import h5py
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", ""), "share", "trident", "analysis"))
from trident_analyze import cli, predicted  # noqa: E402
from trident_analyze.runfile import AnalysisError, RunFile  # noqa: E402

PREDICTION = {"pp": 2, "vpp": 1, "cp": 1, "ep": 1, "dp": 2, "schedule": "1f1b", "cp_layout": "zigzag",
              "micro_batch_size": 2, "num_microbatches": 4, "step_time_s": 0.2, "tokens_per_s": 5000.0,
              "bubble_fraction": 0.2, "time_split_s": {"compute": 0.15, "bubble": 0.05},
              "memory_bytes": {"total": 1.1e6}}


def make_run(path, step_times, prediction=PREDICTION, rss=(1.0e6, 2.0e6), alloc=None):
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "trident-run"
        f.attrs["config_toml"] = ""
        if prediction is not None:
            f.attrs["prediction"] = json.dumps(prediction)
        st = np.dtype([("step", "<i8"), ("loss", "<f8"), ("aux_loss", "<f8"), ("lr", "<f8"), ("grad_norm", "<f8"),
                       ("step_time_s", "<f8"), ("tokens_per_s", "<f8"), ("bubble_fraction", "<f8")])
        rows = np.zeros(len(step_times), dtype=st)
        rows["step"] = np.arange(len(step_times))
        rows["step_time_s"] = step_times
        rows["tokens_per_s"] = 1000.0 / np.asarray(step_times)
        rows["bubble_fraction"] = 0.25
        f.create_dataset("/metrics/steps", data=rows)
        fields = [("rank", "<i4"), ("peak_rss_bytes", "<f8"), ("peak_device_bytes", "<f8")]
        if alloc is not None:
            fields.append(("peak_alloc_bytes", "<f8"))
        rs = np.zeros(2, dtype=np.dtype(fields))
        rs["rank"] = [0, 1]
        rs["peak_rss_bytes"] = rss
        if alloc is not None:
            rs["peak_alloc_bytes"] = alloc
        f.create_dataset("/ranks/summary", data=rs)


def rows(res):
    return {r["quantity"]: r for r in res["rows"]}


def test_medians_after_warmup_and_the_memory_field(tmp_path):
    path = str(tmp_path / "run.h5")
    make_run(path, [5.0, 0.1, 0.3, 0.25, 0.2])  # step 0 (warm-up) is left out: median of the rest 0.225
    with RunFile(path) as rf:
        res = predicted.compare(rf)
    r = rows(res)
    assert r["step_time_s"]["measured"] == pytest.approx(0.225)
    assert r["step_time_s"]["ratio"] == pytest.approx(0.2 / 0.225)
    assert r["bubble_fraction"]["measured"] == pytest.approx(0.25)
    assert r["peak_memory_bytes"]["measured"] == 2.0e6 and res["memory_field"] == "peak_rss_bytes"
    assert res["steps_used"] == 4
    make_run(path, [5.0, 0.1, 0.3], alloc=(1.2e6, 0.9e6))
    with RunFile(path) as rf:
        res = predicted.compare(rf, skip=0)
    assert rows(res)["peak_memory_bytes"]["measured"] == 1.2e6 and res["memory_field"] == "peak_alloc_bytes"
    assert rows(res)["peak_memory_bytes"]["predicted"] == 1.1e6  # a prediction with the total only
    assert rows(res)["step_time_s"]["measured"] == pytest.approx(0.3)
    # a prediction that splits off what the allocator holds is compared by that part
    split = dict(PREDICTION, memory_bytes={"total": 1.1e6, "allocator": 0.96e6, "untracked": 0.14e6})
    make_run(path, [5.0, 0.1, 0.3], prediction=split, alloc=(1.2e6, 0.9e6))
    with RunFile(path) as rf:
        r = rows(predicted.compare(rf))["peak_memory_bytes"]
    assert r["predicted"] == 0.96e6 and r["ratio"] == pytest.approx(0.8)
    make_run(path, [5.0, 0.1, 0.3], prediction=split)  # no allocator peak: the resident set against the total
    with RunFile(path) as rf:
        assert rows(predicted.compare(rf))["peak_memory_bytes"]["predicted"] == 1.1e6


def test_prediction_from_a_plan_json_file(tmp_path, capsys):
    path = str(tmp_path / "run.h5")
    make_run(path, [1.0, 0.4, 0.4], prediction=None)
    with RunFile(path) as rf, pytest.raises(AnalysisError, match="has no root attribute prediction"):
        predicted.compare(rf)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"mesh": {}, "prediction": PREDICTION}))
    assert cli.main(["predicted", path, "--prediction", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "step_time_s" in out and "0.500" in out  # 0.2 predicted / 0.4 measured
    assert cli.main(["predicted", path]) == 2


def test_moe_imbalance_against_the_expert_loads(tmp_path):
    path = str(tmp_path / "run.h5")
    ep2 = dict(PREDICTION, ep=2, moe_imbalance=1.05)
    make_run(path, [5.0, 0.2, 0.2], prediction=ep2)
    # 3 steps, 2 MoE layers, 4 experts: EP rank 0 holds experts 0-1, rank 1 experts 2-3
    loads = np.array([[[9, 9, 1, 1], [9, 9, 1, 1]],        # step 0: warm-up, left out
                      [[30, 30, 10, 10], [20, 20, 20, 20]],  # 60 vs 20: 1.5; even: 1.0
                      [[10, 10, 10, 30], [5, 5, 15, 15]]])    # 20 vs 40: 4/3; 10 vs 30: 1.5
    with h5py.File(path, "a") as f:
        f.create_dataset("/metrics/expert_tokens", data=loads)
    with RunFile(path) as rf:
        r = rows(predicted.compare(rf))["moe_imbalance"]
    assert r["predicted"] == 1.05
    assert r["measured"] == pytest.approx((1.5 + 1.0 + 4 / 3 + 1.5) / 4)
    make_run(path, [5.0, 0.2, 0.2])  # ep = 1: no such row
    with RunFile(path) as rf:
        assert "moe_imbalance" not in rows(predicted.compare(rf))


def test_work_after_the_pipeline_against_the_prediction(tmp_path):
    path = str(tmp_path / "run.h5")
    pred = dict(PREDICTION, time_split_s={"compute": 0.15, "bubble": 0.01, "dp": 0.03, "other": 0.01})
    make_run(path, [5.0, 0.2, 0.2, 0.2], prediction=pred)
    ev_t = np.dtype([("rank", "<i4"), ("step", "<i8"), ("kind", "S16"), ("stage", "<i4"), ("chunk", "<i4"),
                     ("microbatch", "<i4"), ("t_begin_s", "<f8"), ("t_end_s", "<f8")])
    rows_ = []
    # per (step, rank): GUARD begins at b, UPDATE ends at b + d; F/B spans are ignored
    spans = {(0, 0): (1.0, 9.0), (0, 1): (1.0, 9.0),       # step 0: warm-up, left out
             (1, 0): (10.0, 0.05), (1, 1): (10.01, 0.06),  # longest rank: 0.06
             (2, 0): (20.0, 0.03), (2, 1): (20.0, 0.02),   # 0.03
             (3, 0): (30.0, 0.04), (3, 1): (30.0, 0.045)}  # 0.045
    for (step, rank), (b, d) in spans.items():
        rows_ += [(rank, step, b"B", rank, 0, 0, b - 0.1, b),
                  (rank, step, b"GUARD", rank, -1, -1, b, b + 0.001),
                  (rank, step, b"GRAD_REDUCE", rank, -1, -1, b + 0.001, b + d / 2),
                  (rank, step, b"NORM", rank, -1, -1, b + d / 2, b + d / 2),
                  (rank, step, b"UPDATE", rank, -1, -1, b + d / 2, b + d)]
    with h5py.File(path, "a") as f:
        f.create_dataset("/timeline/events", data=np.array(rows_, dtype=ev_t))
    with RunFile(path) as rf:
        r = rows(predicted.compare(rf))["after_pipeline_s"]
    assert r["predicted"] == pytest.approx(0.04)
    assert r["measured"] == pytest.approx(0.045)  # median of 0.06, 0.03, 0.045
    make_run(path, [5.0, 0.2, 0.2], prediction=pred)  # no timeline: no such row
    with RunFile(path) as rf:
        assert "after_pipeline_s" not in rows(predicted.compare(rf))
