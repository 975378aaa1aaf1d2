#!/usr/bin/env python3
"""The step guards of `trident run` under mpirun (4 ranks, pp=2 x cp=2, ep=2):
a NaN put into one rank's gradient stops the job (exit 1, one line naming
the step, the parameter and the rank, the last checkpoint intact and finite)
or, with train.on_nonfinite = "skip", drops exactly that update and counts it;
train.max_skipped_steps ends a run whose steps keep failing; runtime.verify_every
re-executes steps bit for bit and names the rank whose re-run differs when one
bit of its gradient is flipped; a loss spike is reported. On one rank (no
reduction) the NaN is found by the gradient norm's pass and still named."""
import os
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import SMALL_MESH, check, checkpoint_names, checkpoint_tensors, launch, verdict
NP = 4
STEPS = 8

CONFIG = SMALL_MESH + """
[train]
steps = %d
lr = 1e-2
warmup_steps = 2

[runtime]
timeout_s = 30

[output]
timeline = false
checkpoint_every = 1

[topology]
nodes = 1
devices_per_node = 4
nvlink_domain = 4
""" % STEPS




def run(name, sets=(), env=None):
    args = ["job.toml", "--output", name + ".h5", "--set", "output.checkpoint_dir=ck_" + name]
    for s in sets:
        args += ["--set", s]
    return launch(NP, args, env)[:3]


def ckpt(name, step):
    return "ck_%s/ckpt_step_%08d.h5" % (name, step)


def trident_lines(err, level):
    return [l for l in err.splitlines() if l.startswith("trident: " + level)]


def events(name):
    with h5py.File(name + ".h5", "r") as f:
        return [(int(r["step"]), r["kind"].decode(), int(r["rank"]), r["detail"].decode())
                for r in f["events"][()]]


def main():
    os.chdir(tempfile.mkdtemp(prefix="trident-guards-"))
    with open("job.toml", "w") as f:
        f.write(CONFIG)

    rc, out, err = run("full")
    check(rc == 0, "uninterrupted run exits 0 (rc=%d) %s" % (rc, err[-300:]))

    # stop (the default): NaN in rank 2's gradient at step 5. Rank 2 holds
    # pipeline stage 1 (layers 2-3 of 4): the line must name it.
    rc, out, err = run("stop", env={"TRIDENT_TEST_RANK": "2", "TRIDENT_TEST_NAN_GRAD_AT_STEP": "5"})
    lines = trident_lines(err, "error")
    check(rc == 1, "NaN gradient, stop: exit 1 (rc=%d)" % rc)
    check(len(lines) == 1, "stop: exactly one error line: %s" % lines)
    line = lines[0] if lines else ""
    check("step 5" in line and "on rank 2" in line and
          ("(layer 2)" in line or "(layer 3)" in line),
          "stop: the line names step 5, a parameter of layer 2 or 3, rank 2: %s" % line)
    check("ck_stop/ckpt_step_00000005.h5" in line,
          "stop: the line names the last good checkpoint (step 5 = state before step 5)")
    names = checkpoint_names("ck_stop")
    check(names and names[-1] == "ckpt_step_00000005.h5",
          "stop: no checkpoint after the bad step: %s" % names)
    last = checkpoint_tensors(ckpt("stop", 5))
    check(all(np.isfinite(v).all() for v in last.values()), "stop: last checkpoint finite")
    ref = checkpoint_tensors(ckpt("full", 5))
    check(last.keys() == ref.keys() and all(np.array_equal(last[k], ref[k]) for k in ref),
          "stop: last checkpoint equals the uninterrupted run's at step 5 bit for bit")
    check([e[1] for e in events("stop")] == ["nonfinite", "stop"], "stop: events recorded: %s"
          % events("stop"))

    # skip: the same NaN; that update is dropped, optimizer state untouched
    rc, out, err = run("skip", sets=['train.on_nonfinite="skip"'],
                       env={"TRIDENT_TEST_RANK": "2", "TRIDENT_TEST_NAN_GRAD_AT_STEP": "5"})
    check(rc == 0, "skip: exit 0 (rc=%d) %s" % (rc, err[-300:]))
    warn = trident_lines(err, "warning")
    check(len(warn) == 1 and "update skipped" in warn[0] and "on rank 2" in warn[0],
          "skip: one warning line: %s" % warn)
    before, after = checkpoint_tensors(ckpt("skip", 5)), checkpoint_tensors(ckpt("skip", 6))
    check(before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before),
          "skip: parameters, AdamW moments and router biases unchanged by the skipped step 5")
    with h5py.File(ckpt("skip", 6), "r") as a, h5py.File(ckpt("skip", 5), "r") as b:
        check(int(a.attrs["optimizer_steps"]) == int(b.attrs["optimizer_steps"]) == 5,
              "skip: AdamW's step count stays 5 over the skipped step")
    with h5py.File(ckpt("skip", STEPS), "r") as f:
        check(int(f.attrs["optimizer_steps"]) == STEPS - 1, "skip: %d updates in %d steps"
              % (STEPS - 1, STEPS))
    with h5py.File("skip.h5", "r") as f:
        check(int(f.attrs["skipped_steps"]) == 1, "skip: run file counts 1 skipped step")
    check(events("skip") == [(5, "nonfinite", 2, events("skip")[0][3])] if events("skip") else False,
          "skip: one nonfinite event at step 5 naming rank 2: %s" % events("skip"))
    full_last = checkpoint_tensors(ckpt("full", STEPS))
    check(all(np.isfinite(v).all() for v in checkpoint_tensors(ckpt("skip", STEPS)).values()),
          "skip: final checkpoint finite")
    check(any(not np.array_equal(full_last[k], v) for k, v in checkpoint_tensors(ckpt("skip", STEPS)).items()),
          "skip: the run without step 5's update ends elsewhere than the full run")

    # max_skipped_steps: a learning rate that overflows keeps every step non-finite
    rc, out, err = run("diverge", sets=['train.on_nonfinite="skip"', "train.max_skipped_steps=2",
                                        "train.lr=1e30", "train.warmup_steps=0", "train.grad_clip=0"])
    lines = trident_lines(err, "error")
    check(rc == 1 and len(lines) == 1 and "2 steps in a row skipped" in lines[0],
          "diverging run ends after 2 skipped steps in a row (rc=%d): %s" % (rc, lines))
    for n in checkpoint_names("ck_diverge"):
        check(all(np.isfinite(v).all() for v in checkpoint_tensors("ck_diverge/" + n).values()),
              "diverge: checkpoint %s holds no NaN or infinity" % n)

    # verify_every: every 2nd step re-executed; unchanged losses and parameters
    rc, out, err = run("verify", sets=["runtime.verify_every=2"])
    check(rc == 0 and "verify: 4 step(s) re-executed, every one bitwise equal" in out,
          "verify_every=2: 4 steps re-executed, equal (rc=%d) %s" % (rc, out[-300:]))
    with h5py.File("verify.h5", "r") as f, h5py.File("full.h5", "r") as g:
        check(int(f.attrs["verified_steps"]) == 4 and float(f.attrs["verify_overhead_s"]) > 0,
              "verify: run file records 4 verified steps and their overhead")
        check(np.array_equal(f["metrics/steps"]["loss"], g["metrics/steps"]["loss"]),
              "verify: losses equal the run without verification bit for bit")
    v, full = checkpoint_tensors(ckpt("verify", STEPS)), checkpoint_tensors(ckpt("full", STEPS))
    check(all(np.array_equal(v[k], full[k]) for k in full), "verify: final state equal bit for bit")

    # a bit flipped in rank 3's gradient during the re-run of step 3
    rc, out, err = run("flip", sets=["runtime.verify_every=2"],
                       env={"TRIDENT_TEST_RANK": "3", "TRIDENT_TEST_FLIP_GRAD_AT_STEP": "3"})
    lines = trident_lines(err, "error")
    check(rc == 1 and len(lines) == 1 and "step 3" in lines[0] and "rank(s) 3;" in lines[0],
          "flipped bit: exit 1, one line naming step 3 and rank 3 only (rc=%d): %s" % (rc, lines))
    names = sorted(os.listdir("ck_flip"))
    check(names[-1] == "ckpt_step_00000003.h5", "flipped bit: no checkpoint of the suspect step")

    # loss spike: a factor below 1 makes every later step a "spike"
    rc, out, err = run("spike", sets=["train.loss_spike_factor=0.5"])
    warn = trident_lines(err, "warning")
    check(rc == 0 and warn and "running median" in warn[0], "loss spike warned: %s" % warn[:1])
    check(sum(1 for e in events("spike") if e[1] == "loss_spike") == len(warn) > 0,
          "loss spike: one event per warning")

    # one rank: nothing is reduced, so the gradient norm's pass is the scan
    # and the parameters are scanned only when the norm is not finite, to
    # name the first non-finite one (trainer.cpp). The NaN goes into the
    # stage's first parameter, the embedding.
    one = ["job.toml", "--output", "one.h5", "--set", "output.checkpoint_dir=ck_one"]
    for s in ("parallel.pp=1", "parallel.cp=1", "parallel.ep=1", "topology.devices_per_node=1",
              "topology.nvlink_domain=1"):
        one += ["--set", s]
    rc, out, err = launch(1, one, {"TRIDENT_TEST_RANK": "0", "TRIDENT_TEST_NAN_GRAD_AT_STEP": "3"})[:3]
    lines = trident_lines(err, "error")
    check(rc == 1 and len(lines) == 1, "one rank, NaN gradient: exit 1, one error line (rc=%d) %s"
          % (rc, lines))
    line = lines[0] if lines else ""
    check("step 3" in line and "first in parameter embedding" in line and "on rank 0" in line,
          "one rank: the line names step 3, the embedding and rank 0: %s" % line)
    check([e[1] for e in events("one")] == ["nonfinite", "stop"], "one rank: events recorded: %s"
          % events("one"))

    return verdict()


if __name__ == "__main__":
    sys.exit(main())
