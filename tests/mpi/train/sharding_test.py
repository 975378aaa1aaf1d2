#!/usr/bin/env python3
"""`trident run` with train.optimizer_sharding = "dp" (ZeRO-1) on 4 ranks
(cp=2 ep=2 dp=2: dense parameters sharded over 4 ranks, experts over 2
replicas) equals the unsharded run bit for bit: the losses and gradient
norms of 10 steps, and every tensor of the checkpoints (parameters and
moments), also with bucketed reduction (train.grad_bucket_mb); and a run
resumes with sharding on from a checkpoint written with it off, and the
reverse, continuing bit for bit as the uninterrupted runs do. (Every
gradient sum is bracketed in rank order on the MPI backend, and the norm
is summed over the same parts either way: share/trident/memory.md.)"""
import os
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import check, checkpoint_tensors, launch, small_mesh, verdict

NP = 4
STEPS = 10
CONFIG = small_mesh(data=['task = "recall"']) + """
[train]
steps = %d
lr = 1e-2
warmup_steps = 2

[runtime]
timeout_s = 30

[output]
timeline = false
checkpoint_every = 5

[topology]
nodes = 1
devices_per_node = 4
nvlink_domain = 4
""" % STEPS
# small_mesh's pp = 2 made 1 here: dp = 2 gives every kind of parameter replicas.
MESH = ["--set", "parallel.pp=1"]


def curve(path):
    with h5py.File(path, "r") as f:
        rows = f["metrics/steps"][:]
        return {int(r["step"]): (float(r["loss"]), float(r["grad_norm"])) for r in rows}


def run(name, sharding, extra=()):
    rc, out, err, _ = launch(NP, ["job.toml", "--output", name + ".h5"] + MESH +
                             ["--set", "train.optimizer_sharding=\"%s\"" % sharding,
                              "--set", "output.checkpoint_dir=ck_" + name] + list(extra),
                             timeout=300)
    check(rc == 0, "%s run exits 0 (rc=%d) %s" % (name, rc, err.strip()[-300:]))
    return curve(name + ".h5") if rc == 0 else {}


def compare(a, b, steps, what):
    """Losses and gradient norms of the steps, bit for bit."""
    same = sorted(b) == list(steps) and all(s in a and a[s] == b[s] for s in steps)
    worst = max((abs(a[s][i] - b[s][i]) / max(abs(a[s][i]), 1e-30)
                 for s in steps if s in a and s in b for i in (0, 1)), default=float("inf"))
    check(same, "%s: losses and gradient norms bit for bit equal (largest relative "
          "difference %.2e)" % (what, worst))
    for s in steps:
        if s in a and s in b:
            print("  step %d: loss %.9f vs %.9f  norm %.9f vs %.9f" % (s, a[s][0], b[s][0], a[s][1], b[s][1]))


def compare_checkpoints(a_dir, b_dir, step, what):
    """Every tensor of the two checkpoints (parameters, moments), bit for bit."""
    try:
        a = checkpoint_tensors("%s/ckpt_step_%08d.h5" % (a_dir, step))
        b = checkpoint_tensors("%s/ckpt_step_%08d.h5" % (b_dir, step))
    except OSError as e:
        check(False, "%s, checkpoint at step %d: readable (%s)" % (what, step, e))
        return
    names = a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
    worst = max((float(np.max(np.abs(a[k] - b[k])) / max(float(np.max(np.abs(a[k]))), 1e-12))
                 for k in a if a[k].size), default=0.0) if names else float("inf")
    differ = [k for k in a if names and not np.array_equal(a[k], b[k])]
    check(names and not differ and any(k.startswith("adam_m/") for k in a),
          "%s, checkpoint at step %d: the same %d tensors (params, moments), bit for bit "
          "(%d differ, largest difference %.2e of the tensor's largest entry)%s"
          % (what, step, len(a), len(differ), worst,
             (": " + ", ".join(differ[:3])) if differ else ""))


def main():
    work = tempfile.mkdtemp(prefix="trident-sharding-test-")
    os.chdir(work)
    with open("job.toml", "w") as f:
        f.write(CONFIG)

    none = run("none", "none")
    dp = run("dp", "dp")
    compare(none, dp, range(STEPS), "sharded vs unsharded, 10 steps")
    # The checkpoint does not depend on the sharding: the same names, shapes
    # and bits, moments included.
    for step in (5, STEPS):
        compare_checkpoints("ck_none", "ck_dp", step, "sharded vs unsharded")

    # Bucketed reduction overlapped with the backward (several buckets per
    # stage): the same bits as the unbucketed runs, sharded or not.
    bucket = ["--set", "train.grad_bucket_mb=0.02"]
    none_b = run("none_bucketed", "none", bucket)
    dp_b = run("dp_bucketed", "dp", bucket)
    compare(none_b, dp_b, range(STEPS), "bucketed: sharded vs unsharded")
    compare(none, dp_b, range(STEPS), "sharded bucketed vs unsharded unbucketed")
    compare_checkpoints("ck_none", "ck_dp_bucketed", STEPS, "sharded bucketed vs unsharded")

    # Resume across the setting from the step-5 checkpoint of the other one.
    on = run("resume_on", "dp", ["--resume", "ck_none/ckpt_step_00000005.h5"])
    compare(dp, on, range(5, STEPS), "sharding on, resumed from an unsharded checkpoint")
    compare(none, on, range(5, STEPS), "  ... against the unsharded run")
    compare_checkpoints("ck_dp", "ck_resume_on", STEPS, "  ... final")
    off = run("resume_off", "none", ["--resume", "ck_dp/ckpt_step_00000005.h5"])
    compare(none, off, range(5, STEPS), "sharding off, resumed from a sharded checkpoint")
    compare_checkpoints("ck_none", "ck_resume_off", STEPS, "  ... final")

    # A bad value is an input error naming the key.
    rc, out, err, _ = launch(NP, ["job.toml", "--output", "bad.h5", "--set",
                                  "train.optimizer_sharding=\"zero3\""])
    check(rc == 2 and "train.optimizer_sharding" in err and not os.path.exists("bad.h5"),
          "optimizer_sharding = \"zero3\": exit 2 naming the key, no run file (rc=%d) %s"
          % (rc, err.strip()[-200:]))
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
