"""What the train tests that drive `trident run` under mpirun share: the binary
and the launcher from ctest's environment, a small 4-rank model, a check that
records failures and the verdict over them, one launch, and a checkpoint's
tensors."""
import os
import shlex
import subprocess
import time

import h5py

BIN = os.environ["TRIDENT_BIN"]
MPIRUN = shlex.split(os.environ["TRIDENT_MPIRUN"])

# pp=2 cp=2 ep=2 on 4 ranks: every parallelism, small enough for 2 cores.
SMALL_MESH_SECTIONS = {
    "model": ["vocab_size = 32", "d_model = 32", "n_layers = 4", "n_heads = 4", "n_kv_heads = 2",
              "ffn_hidden = 48", "n_experts = 4", "top_k = 2"],
    "data": ["seq_len = 32", "micro_batch_size = 1", "num_microbatches = 2"],
    "parallel": ["pp = 2", "cp = 2", "ep = 2"],
}


def small_mesh(**extra):
    """The small mesh's TOML, each section followed by the lines given for it
    (small_mesh(model=['router = "sigmoid_bias"'])): TOML cannot reopen a
    section, so a test's additions go in here, not after the text."""
    return "".join("\n[%s]\n%s\n" % (name, "\n".join(lines + list(extra.get(name, ()))))
                   for name, lines in SMALL_MESH_SECTIONS.items())


SMALL_MESH = small_mesh()


def checkpoint_job(steps, checkpoint_every):
    """The job the checkpoint tests save, kill and resume: the small mesh with
    the sigmoid_bias router, `steps` steps at lr 1e-2 after 2 warm-up steps,
    a checkpoint every `checkpoint_every` steps, 60 s deadlines, no timeline."""
    return small_mesh(model=['router = "sigmoid_bias"']) + """
[train]
steps = %d
lr = 1e-2
warmup_steps = 2

[runtime]
timeout_s = 60

[output]
checkpoint_every = %d
timeline = false
""" % (steps, checkpoint_every)

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def launch(np, args, env=None, timeout=120):
    """`trident run ARGS` on np ranks: (exit code, stdout, stderr, seconds)."""
    e = dict(os.environ)
    e.update(env or {})
    t0 = time.time()
    p = subprocess.run(MPIRUN + ["-np", str(np), BIN, "run"] + args, env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr, time.time() - t0


def verdict():
    """The test's exit code: 1 when a check failed, else 0."""
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


def checkpoint_tensors(path):
    """Every dataset under a checkpoint's /tensors, by its path there."""
    out = {}
    with h5py.File(path, "r") as f:
        f["tensors"].visititems(lambda n, o: out.__setitem__(n, o[()])
                                if isinstance(o, h5py.Dataset) else None)
    return out


def checkpoint_names(ckdir):
    """The complete checkpoints in ckdir (ckpt_step_NNNNNNNN.h5: the index of a
    sharded checkpoint or a single file; not its shards), oldest first."""
    if not os.path.isdir(ckdir):
        return []
    return sorted(n for n in os.listdir(ckdir)
                  if len(n) == 21 and n.startswith("ckpt_step_") and n[10:18].isdigit() and n.endswith(".h5"))
