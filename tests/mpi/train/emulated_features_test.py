#!/usr/bin/env python3
"""`trident run` on the emulated device equals the CPU run bit for bit for
every feature that reaches the device on the small 4-rank mesh (pp=2 x cp=2,
ep=2, MoE): every pipeline schedule (afab, interleaved, zb-h1, zb-v,
dualpipev, the last with selective recomputation; 1f1b is train_emulated's),
the sigmoid_bias router with capacity drops, full recomputation, activation captures (device tensors copied out),
the non-finite guard skipping a step, verify_every naming a flipped bit, and
a resume from a checkpoint written on the device. The emulated device stops
a run with exit 86 on any host access to device memory and on any host
pointer handed to a device op, so each passing run also proves that the
path keeps its data on the device. Both backends use the alltoallv EP
transport (the device's; shm needs host rows)."""
import os
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import check, checkpoint_tensors, launch, small_mesh, verdict

NP = 4
STEPS = 3
TOPO = "\n[topology]\nnodes = 1\ndevices_per_node = 4\nnvlink_domain = 4\n"
BASE = ["train.steps=%d" % STEPS, "train.lr=1e-2", "train.warmup_steps=1",
        "data.num_microbatches=4", 'runtime.ep_transport="alltoallv"', "runtime.timeout_s=60",
        "output.timeline=false"]

VARIANTS = {
    "afab": ['parallel.schedule="afab"'],
    "interleaved": ['parallel.schedule="interleaved"', "parallel.vpp=2"],
    "zb-h1": ['parallel.schedule="zb-h1"'],
    "zb-v": ['parallel.schedule="zb-v"', "parallel.vpp=2"],
    # selective recompute rides along (bit-identical to none, so free to add)
    "dualpipev+selective": ['parallel.schedule="dualpipev"', "parallel.vpp=2",
                            'train.recompute="selective"'],
    "router+captures+recompute": [
        'model.router="sigmoid_bias"', "model.capacity_factor=1.0", 'train.recompute="full"',
        "output.activation_steps=[1]", "output.activation_layers=[0,3]",
        "output.activation_samples=[0,3]"],
}


def run(tmp, name, backend, sets=(), env=None, resume=None, ck=None):
    out = os.path.join(tmp, "%s-%s.h5" % (name, backend))
    ck = ck or os.path.join(tmp, "ck-%s-%s" % (name, backend))
    args = [os.path.join(tmp, "job.toml"), "--output", out]
    if resume:
        args += ["--resume", resume]
    for s in BASE + ["runtime.backend=" + backend, "output.checkpoint_dir=" + ck] + list(sets):
        args += ["--set", s]
    code, so, se, secs = launch(NP, args, env=env, timeout=300)
    return code, so, se, out, ck


def losses(path):
    with h5py.File(path, "r") as f:
        return np.array(f["metrics/steps"]["loss"])


def activations(path):
    got = {}
    with h5py.File(path, "r") as f:
        if "activations" not in f:
            return got
        f["activations"].visititems(
            lambda n, o: got.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return got


def same(a, b):
    return a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)


def compare(tmp, name, sets=(), env=None, extra=""):
    cpu = run(tmp, name, "cpu", sets, env)
    emu = run(tmp, name, "emulated", sets, env)
    ok = cpu[0] == 0 and emu[0] == 0
    check(ok, "%s: both runs exit 0 (cpu %d, emulated %d)%s" %
          (name, cpu[0], emu[0], "" if ok else ": " + (emu[2] or cpu[2])[-500:]))
    if not ok:
        return None
    check(losses(cpu[3]).tobytes() == losses(emu[3]).tobytes(),
          "%s: losses bit-identical %s" % (name, losses(emu[3])))
    step = "ckpt_step_%08d.h5" % STEPS
    check(same(checkpoint_tensors(os.path.join(cpu[4], step)),
               checkpoint_tensors(os.path.join(emu[4], step))),
          "%s: final checkpoints bit-identical" % name)
    return cpu, emu


def main():
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "job.toml"), "w") as f:
            f.write(small_mesh() + TOPO)
        for name, sets in VARIANTS.items():
            both = compare(tmp, name, sets)
            if both and name.startswith("router"):
                a, b = activations(both[0][3]), activations(both[1][3])
                check(len(a) >= 5 and same(a, b),
                      "%s: %d captured activations bit-identical" % (name, len(a)))

        # the non-finite guard: a NaN in rank 2's gradient at step 2, skipped
        nan = {"TRIDENT_TEST_RANK": "2", "TRIDENT_TEST_NAN_GRAD_AT_STEP": "2"}
        both = compare(tmp, "nonfinite-skip", ['train.on_nonfinite="skip"'], env=nan)
        if both:
            with h5py.File(both[1][3], "r") as f:
                check(int(f.attrs["skipped_steps"]) == 1, "nonfinite-skip: one step skipped")

        # verify_every: re-executed steps equal, and a flipped bit is named
        code, so, se, _, _ = run(tmp, "verify", "emulated", ["runtime.verify_every=1"])
        check(code == 0 and "every one bitwise equal" in so,
              "verify_every on the device: re-executed steps bitwise equal (exit %d)" % code)
        flip = {"TRIDENT_TEST_RANK": "1", "TRIDENT_TEST_FLIP_GRAD_AT_STEP": "2"}
        code, so, se, _, _ = run(tmp, "verify-flip", "emulated", ["runtime.verify_every=1"],
                                 env=flip)
        lines = [l for l in se.splitlines() if l.startswith("trident: error")]
        check(code == 1 and len(lines) == 1 and "rank(s) 1;" in lines[0],
              "verify_every on the device: a flipped bit on rank 1 ends the run with one line "
              "naming rank 1 (exit %d): %s" % (code, lines))

        # resume on the device from its own checkpoint of step 2: the final
        # state equals the uninterrupted CPU run's
        full = run(tmp, "resume-full", "cpu", ["output.checkpoint_every=1"])
        part = run(tmp, "resume-part", "emulated", ["output.checkpoint_every=1"])
        if full[0] == 0 and part[0] == 0:
            again = run(tmp, "resume-again", "emulated", ["output.checkpoint_every=1"],
                        resume=os.path.join(part[4], "ckpt_step_%08d.h5" % 2),
                        ck=os.path.join(tmp, "ck-resumed"))
            check(again[0] == 0, "resume on the device: exit %d %s" % (again[0], again[2][-300:]))
            step = "ckpt_step_%08d.h5" % STEPS
            if again[0] == 0:
                check(same(checkpoint_tensors(os.path.join(full[4], step)),
                           checkpoint_tensors(os.path.join(again[4], step))),
                      "resume on the device from step 2 ends bit-identical to the CPU's "
                      "uninterrupted run")
        else:
            check(False, "resume: the first runs exit 0 (cpu %d, emulated %d)" % (full[0], part[0]))
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
