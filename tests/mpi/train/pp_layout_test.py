#!/usr/bin/env python3
"""parallel.pp_layout: uneven pipeline stages. A 6-layer quickstart model on
the 8-rank mesh (pp2 cp2 dp2 ep2) with [2, 4] (one chunk per rank) or
[1, 2, 2, 1] (two chunks: interleaved, zb-v, dualpipev) trains as the 1-rank
run does (losses, gradient norms within 1e-4 over 4 steps; final
checkpoint tensors within 1e-4 of their largest entry) under every schedule;
a checkpoint written with one layout resumes with another and continues as
the uninterrupted run; bad layouts exit 2 with one line naming the key and
leave no run file."""
import os
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import check, checkpoint_tensors, launch, verdict

SRC = os.environ["TRIDENT_SOURCE_DIR"]
QUICKSTART = os.path.join(SRC, "share/trident/examples/quickstart.toml")
STEPS = 4
SIX = ["--set", "model.n_layers=6"]
ONE_RANK = ["--set", "data.num_microbatches=8", "--set", "parallel.pp=1", "--set", "parallel.cp=1",
            "--set", "parallel.ep=1", "--set", "topology.nodes=1",
            "--set", "topology.devices_per_node=1", "--set", "topology.nvlink_domain=1"]
LAYOUT1 = ["--set", "parallel.pp_layout=[2,4]"]
LAYOUT2 = ["--set", "parallel.pp_layout=[1,2,2,1]"]
SCHEDULES = [("1f1b", LAYOUT1),
             ("afab", ["--set", "parallel.schedule=afab"] + LAYOUT1),
             ("zb-h1", ["--set", "parallel.schedule=zb-h1"] + LAYOUT1),
             ("interleaved", ["--set", "parallel.schedule=interleaved", "--set", "parallel.vpp=2"]
              + LAYOUT2),
             ("zb-v", ["--set", "parallel.schedule=zb-v", "--set", "parallel.vpp=2"] + LAYOUT2),
             ("dualpipev", ["--set", "parallel.schedule=dualpipev", "--set", "parallel.vpp=2"]
              + LAYOUT2)]


def run(d, tag, np_, extra, steps=STEPS):
    out = os.path.join(d, tag + ".h5")
    ck = os.path.join(d, "ck-" + tag)
    rc, _, err, secs = launch(np_, [QUICKSTART, "--set", "train.steps=%d" % steps,
                                    "--set", "output.checkpoint_dir=" + ck,
                                    "--set", "output.checkpoint_every=2",
                                    "--set", "output.timeline=false", "--output", out] + SIX + extra,
                              timeout=300)
    check(rc == 0, "%s exits 0 (%.0f s)%s" % (tag, secs, "" if rc == 0 else ": " + err[-400:]))
    if rc != 0:
        return None
    with h5py.File(out, "r") as f:
        steps_ = f["metrics/steps"][:]
    last = sorted(os.listdir(ck))[-1]
    return steps_, checkpoint_tensors(os.path.join(ck, last)), ck


def rel(a, b):
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(a), 1e-30)))


def tensors_close(a, b, tol):
    if a.keys() != b.keys():
        return False, float("inf")
    w = max((float(np.max(np.abs(a[k] - b[k]))) / max(float(np.max(np.abs(a[k]))), 1e-30)
             for k in a if a[k].size), default=0.0)
    return w <= tol, w


def main():
    with tempfile.TemporaryDirectory() as d:
        one = run(d, "one-rank", 1, ONE_RANK)
        if one is None:
            return verdict()
        for name, extra in SCHEDULES:
            got = run(d, name, 8, extra)
            if got is None:
                return verdict()
            w = max(rel(one[0][k], got[0][k]) for k in ("loss", "grad_norm"))
            check(w <= 1e-4, "%s with %s: losses and gradient norms within 1e-4 of 1 rank "
                  "over %d steps (%.1e)" % (name, extra[-1].split("=")[1], STEPS, w))
            ok, wt = tensors_close(one[1], got[1], 1e-4)
            check(ok, "%s: final checkpoint tensors within 1e-4 of 1 rank's (%.1e)" % (name, wt))

        # Checkpoints do not depend on the layout: resume [2, 4]'s step-2
        # checkpoint with [4, 2] and with the even split.
        base = run(d, "base", 8, LAYOUT1)
        if base is None:
            return verdict()
        for tag, layout in (("resume-42", ["--set", "parallel.pp_layout=[4,2]"]),
                            ("resume-even", [])):
            got = run(d, tag, 8, layout + ["--resume", os.path.join(base[2],
                                                                    "ckpt_step_00000002.h5")])
            if got is None:
                return verdict()
            ok = sorted(got[0]["step"]) == [2, 3]
            w = max(rel(base[0][k][2:], got[0][k]) for k in ("loss", "grad_norm")) if ok else 1
            check(ok and w <= 1e-6, "resumed from [2, 4] with %s: steps 2-3 as the "
                  "uninterrupted run (%.1e)" % (layout[-1] if layout else "the even split", w))
            ok, wt = tensors_close(base[1], got[1], 1e-6)
            check(ok, "%s: final checkpoint equals the uninterrupted run's (%.1e)" % (tag, wt))

        # Bad layouts: one line naming the key, exit 2, no run file.
        for bad, what in (("[2,3]", "sums to 5, not 6"), ("[0,6]", "a stage with no layer"),
                          ("[2,2,2]", "3 entries for pp 2")):
            out = os.path.join(d, "bad.h5")
            rc, so, err, _ = launch(8, [QUICKSTART, "--output", out, "--set",
                                        "parallel.pp_layout=" + bad] + SIX)
            lines = [l for l in err.strip().splitlines() if l.startswith("trident:")]
            check(rc == 2 and "parallel.pp_layout" in err and not os.path.exists(out),
                  "pp_layout = %s (%s): exit 2 naming the key, no run file (rc=%d) %s"
                  % (bad, what, rc, err.strip()[-200:]))
            check(len(set(lines)) == 1, "pp_layout = %s: one distinct trident line %s"
                  % (bad, lines[:3]))
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
