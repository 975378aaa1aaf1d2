"""What the train tests that drive `trident run` under mpirun share: the binary
and the launcher from ctest's environment, a small 4-rank model, a check that
records failures, and one launch."""
import os
import shlex
import subprocess
import time

BIN = os.environ["TRIDENT_BIN"]
MPIRUN = shlex.split(os.environ["TRIDENT_MPIRUN"])

# pp=2 cp=2 ep=2 on 4 ranks: every parallelism, small enough for 2 cores.
SMALL_MESH = """
[model]
vocab_size = 32
d_model = 32
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_hidden = 48
n_experts = 4
top_k = 2

[data]
seq_len = 32
micro_batch_size = 1
num_microbatches = 2

[parallel]
pp = 2
cp = 2
ep = 2
"""

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
