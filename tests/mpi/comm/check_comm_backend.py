#!/usr/bin/env python3
"""runtime.comm is chosen once, when the mesh's communicators are built:
"nccl" in a build without NCCL, or on a rank that sees no GPU, ends `trident
topo` and `trident run` with exit code 2 and one line naming runtime.comm,
before any output file exists; "mpi" and "auto" run. On a machine with a GPU
and a build with NCCL, "nccl" is usable and must run instead."""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ["TRIDENT_BIN"]
MPIRUN = shlex.split(os.environ["TRIDENT_MPIRUN"])

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def trident(np, *args):
    env = dict(os.environ)
    env.pop("TRIDENT_TOPOLOGY", None)
    p = subprocess.run(MPIRUN + ["-np", str(np), BIN, *args],
                       capture_output=True, text=True, env=env, timeout=100)
    errors = [l for l in p.stderr.splitlines() if l.startswith("trident: error")]
    return p.returncode, errors, p.stderr


def gpu_visible():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return False
    p = subprocess.run([smi, "-L"], capture_output=True, text=True)
    return p.returncode == 0 and "GPU" in p.stdout


nccl_usable = gpu_visible() and os.environ.get("TRIDENT_HAVE_NCCL") == "ON"

for comm in ("mpi", "auto"):
    rc, errors, err = trident(2, "topo", "--set", f"runtime.comm={comm}")
    check(rc == 0 and not errors, f"topo runtime.comm={comm}: exit {rc}, {err.strip()[-300:]}")

rc, errors, err = trident(2, "topo", "--set", "runtime.comm=nccl")
if nccl_usable:
    check(rc == 0, f"topo runtime.comm=nccl with a GPU: exit {rc}, {err.strip()[-300:]}")
else:
    check(rc == 2 and len(errors) == 1 and "runtime.comm" in errors[0] and "nccl" in errors[0],
          f"topo runtime.comm=nccl: exit {rc}, {errors}")

with tempfile.TemporaryDirectory() as tmp:
    cfg = os.path.join(tmp, "small.toml")
    with open(cfg, "w") as f:
        f.write("[train]\nsteps = 1\n[runtime]\ncomm = \"nccl\"\n")
    out = os.path.join(tmp, "out.h5")
    rc, errors, err = trident(1, "run", cfg, "--output", out)
    if not nccl_usable:
        check(rc == 2 and len(errors) == 1 and errors[0].startswith("trident: error: runtime.comm"),
              f"run with runtime.comm = nccl: exit {rc}, {errors}")
        check(not os.path.exists(out), "run with runtime.comm = nccl left an output file")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("runtime.comm checks passed")
