#!/usr/bin/env python3
"""`trident run` on the emulated device (runtime.backend = "emulated") equals
the CPU run bit for bit: the same losses in the run file and the same
checkpoint tensors, on 1 rank and on pp=2 x cp=2 (4 ranks: pipeline sends,
the ring's K/V and the gradient reduction all go through MPI's staging of
device buffers), with runtime.verify_every re-executing steps, and an MoE model with capacity
drops on the quickstart's mesh pp2 cp2 dp2 ep2 (8 ranks: routing on the
device, the token exchange staged). A host access to device memory anywhere
on the way would end the emulated run with exit 86 and one line (faults.md)."""
import os
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import check, checkpoint_tensors, launch, verdict

STEPS = 4
MODEL = """
[model]
vocab_size = 32
d_model = 32
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_hidden = 48
%s

[data]
seq_len = 32
micro_batch_size = 1
num_microbatches = 2

[train]
steps = %d
lr = 1e-2
warmup_steps = 2
weight_decay = 0.1

[runtime]
timeout_s = 60
verify_every = 2

[output]
timeline = false
""" % ("%s", STEPS)

DENSE = "n_experts = 0"
MOE = "n_experts = 4\ntop_k = 2\ncapacity_factor = 1.25"
MESHES = {
    1: "[parallel]\npp = 1\n\n[topology]\nnodes = 1\ndevices_per_node = 1\nnvlink_domain = 1\n",
    4: "[parallel]\npp = 2\ncp = 2\n\n[topology]\nnodes = 1\ndevices_per_node = 4\n"
       "nvlink_domain = 4\n",
    8: "[parallel]\npp = 2\ncp = 2\nep = 2\n\n[topology]\nnodes = 2\ndevices_per_node = 4\n"
       "nvlink_domain = 4\n",
}


def run(tmp, np_, backend):
    cfg = os.path.join(tmp, "np%d.toml" % np_)
    with open(cfg, "w") as f:
        f.write(MODEL % (MOE if np_ == 8 else DENSE) + MESHES[np_])
    out = os.path.join(tmp, "%s-np%d.h5" % (backend, np_))
    ck = os.path.join(tmp, "ck-%s-np%d" % (backend, np_))
    # Both backends move MoE tokens by alltoallv: the device's transport
    # (shm needs host rows), so that the two runs compare like with like.
    code, so, se, secs = launch(np_, [cfg, "--output", out, "--set", "runtime.backend=" + backend,
                                      "--set", 'runtime.ep_transport="alltoallv"',
                                      "--set", "output.checkpoint_dir=" + ck], timeout=300)
    said = [l for l in se.splitlines() if l.startswith("trident")]
    check(code == 0, "np %d %s: exit %d in %.1f s%s" % (np_, backend, code, secs,
                                                        "" if code == 0 else ": " +
                                                        "\n".join(said or [se[-600:]])))
    if code != 0:
        return None
    check("every one bitwise equal" in so, "np %d %s: verify_every re-executed steps equal" %
          (np_, backend))
    with h5py.File(out, "r") as f:
        losses = np.array(f["metrics/steps"]["loss"])
        ran = f.attrs["backend"]
        ran = ran.decode() if isinstance(ran, bytes) else str(ran)
    check(ran == backend, "np %d: run file backend %r" % (np_, ran))
    return losses, checkpoint_tensors(os.path.join(ck, "ckpt_step_%08d.h5" % STEPS))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for np_ in (1, 4, 8):
            cpu = run(tmp, np_, "cpu")
            emu = run(tmp, np_, "emulated")
            if cpu is None or emu is None:
                continue
            check(len(cpu[0]) == STEPS and cpu[0].tobytes() == emu[0].tobytes(),
                  "np %d: losses bit-identical (cpu %s, emulated %s)" % (np_, cpu[0], emu[0]))
            names = sorted(cpu[1])
            check(len(names) > 0 and names == sorted(emu[1]),
                  "np %d: the same %d checkpoint tensors" % (np_, len(names)))
            differ = [n for n in names if n in emu[1] and
                      cpu[1][n].tobytes() != emu[1][n].tobytes()]
            check(not differ, "np %d: every checkpoint tensor bit-identical%s" %
                  (np_, "" if not differ else " (differ: %s)" % ", ".join(differ[:5])))
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
