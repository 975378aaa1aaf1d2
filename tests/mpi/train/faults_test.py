#!/usr/bin/env python3
"""Failures of `trident run` that must end every rank quickly with one line
from the rank that knows the cause, and no MPI_Abort banner or library
backtrace (4 ranks under mpirun).

  faults_test.py ranks: a SIGSTOPped rank (the others' deadline fires, one
      message naming the stopped peer, every rank gone within the deadline);
      a checkpoint damaged where only some ranks read (exit 2 at once, one
      line); --resume passing over a truncated newest checkpoint.
  faults_test.py io: a full and a read-only checkpoint directory and a
      read-only run-file directory (small tmpfs mounts; exit 77 = SKIP with
      the reason where mounting is not allowed).
"""
import os
import subprocess
import sys
import tempfile

import h5py

from mpirun_cli import SMALL_MESH, check, failures, launch
NP = 4
TIMEOUT_S = 5

CONFIG = SMALL_MESH + """
[train]
steps = 6
warmup_steps = 1

[runtime]
timeout_s = %d

[output]
timeline = false
checkpoint_every = 2

[topology]
nodes = 1
devices_per_node = 4
nvlink_domain = 4
""" % TIMEOUT_S

# What must never reach the user's terminal from a failure trident handles.
NOISE = ["MPI_ABORT", "UCX  ERROR", "backtrace", "Segmentation", "terminate called"]




def run(args, env=None, timeout=120):
    return launch(NP, ["job.toml"] + args, env, timeout)


def one_error_line(err, what):
    lines = [l for l in err.splitlines() if l.startswith("trident: error")]
    check(len(lines) == 1, "%s: exactly one error line: %s" % (what, lines))
    noise = [n for n in NOISE if n in err]
    check(not noise, "%s: no MPI_Abort banner or library backtrace (%s)" % (what, noise))
    return lines[0] if lines else ""


def ranks_mode():
    # 1. rank 2 stops itself (SIGSTOP) at step 3: its peers' waits time out
    rc, out, err, took = run(["--output", "stop.h5", "--set", "output.checkpoint_dir=ck_stop"],
                             env={"TRIDENT_TEST_RANK": "2", "TRIDENT_TEST_STOP_AT_STEP": "3"})
    check(rc == 1, "SIGSTOPped rank: exit 1 (rc=%d)" % rc)
    line = one_error_line(err, "SIGSTOPped rank")
    check("timed out after %ds" % TIMEOUT_S in line and "(world 2" in line,
          "SIGSTOPped rank: the line names the timeout and world rank 2 as the peer: " + line)
    # start-up is a few seconds; the deadline plus 1 s for the others to end
    check(took < TIMEOUT_S + 12, "SIGSTOPped rank: the job ended %.1f s after launch "
          "(deadline %d s)" % (took, TIMEOUT_S))
    left = subprocess.run(["pgrep", "-f", "stop.h5"], stdout=subprocess.PIPE, text=True).stdout
    check(not left.strip(), "SIGSTOPped rank: no rank left running: %s" % left.split())

    # 2. a full run for checkpoints, then one tensor damaged that only the
    #    ranks of pipeline stage 1 (layers 2-3) read
    rc, out, err, _ = run(["--output", "full.h5", "--set", "output.checkpoint_dir=ck"])
    check(rc == 0, "full run exits 0 (rc=%d) %s" % (rc, err[-300:]))
    src = "ck/ckpt_step_00000004.h5"
    blob = bytearray(open(src, "rb").read())
    with h5py.File(src, "r") as f:
        off = f["tensors/param/layers.3.ffn_norm"].id.get_offset()
    for i in range(8):
        blob[off + i] ^= 0x5A
    os.makedirs("ck_bad", exist_ok=True)
    open("ck_bad/part.h5", "wb").write(blob)
    rc, out, err, took = run(["--output", "bad.h5", "--resume", "ck_bad/part.h5"])
    check(rc == 2, "checkpoint damaged for some ranks: exit 2 (rc=%d)" % rc)
    line = one_error_line(err, "checkpoint damaged for some ranks")
    check("layers.3.ffn_norm" in line and "checksum" in line,
          "damaged for some ranks: the line names the tensor and the checksum: " + line)
    check(took < 15, "damaged for some ranks: ended in %.1f s, no deadline waited" % took)
    check(not os.path.exists("bad.h5"), "damaged for some ranks: no run file left behind")

    # 3. the newest checkpoint truncated: --resume passes over it to the one before
    ck = sorted(n for n in os.listdir("ck") if n.endswith(".h5"))
    newest = "ck/" + ck[-1]
    data = open(newest, "rb").read()
    open(newest, "wb").write(data[: len(data) // 2])
    rc, out, err, _ = run(["--output", "res.h5", "--set", "output.checkpoint_dir=ck", "--resume"])
    check(rc == 0, "resume past a truncated checkpoint: exit 0 (rc=%d) %s" % (rc, err[-300:]))
    warn = [l for l in err.splitlines() if l.startswith("trident: warning: not resuming from")]
    check(len(warn) == 1 and ck[-1] in warn[0], "the truncated checkpoint is named: %s" % warn)
    check("resumed from ck/%s" % ck[-2] in out, "resumed from the one before: " +
          "".join(l for l in out.splitlines() if l.startswith("resumed")))


def mount_tmpfs(path, size, readonly=False):
    os.makedirs(path, exist_ok=True)
    opts = "size=%s%s" % (size, ",ro" if readonly else "")
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode == 0, p.stdout.strip()


def io_mode():
    ok, why = mount_tmpfs("full", "64k")
    if not ok:
        print("SKIP: mounting a small tmpfs is not allowed here (%s); the full and read-only "
              "directory checks need it" % why)
        return 77
    try:
        ok_ro, why_ro = mount_tmpfs("ro", "64k", readonly=True)
        check(ok_ro, "read-only tmpfs mounted (%s)" % why_ro)
        rc, out, err, _ = run(["--output", "a.h5", "--set", "output.checkpoint_dir=full/ck"])
        check(rc == 1, "full checkpoint directory: exit 1 (rc=%d)" % rc)
        line = one_error_line(err, "full checkpoint directory")
        check("full/ck/ckpt_step_00000002.h5" in line and "No space left on device" in line,
              "full: the line names the file and the system's reason: " + line)
        check(not [n for n in os.listdir("full/ck") if ".tmp" in n],
              "full: no temporary file left: %s" % os.listdir("full/ck"))
        rc, out, err, _ = run(["--output", "b.h5", "--set", "output.checkpoint_dir=ro/ck"])
        check(rc == 1, "read-only checkpoint directory: exit 1 (rc=%d)" % rc)
        line = one_error_line(err, "read-only checkpoint directory")
        check("ro/ck" in line and "Read-only file system" in line,
              "read-only: the line names the directory and the reason: " + line)
        rc, out, err, _ = run(["--output", "ro/run.h5", "--set", "output.checkpoint_dir=ck2"])
        check(rc == 2, "read-only run-file directory: exit 2 (rc=%d)" % rc)
        line = one_error_line(err, "read-only run-file directory")
        check("ro/run.h5" in line and "Read-only file system" in line,
              "read-only run file: the line names the file and the reason: " + line)
    finally:
        for m in ("full", "ro"):
            subprocess.run(["umount", m], stderr=subprocess.DEVNULL)
    return 0


def main():
    mode = sys.argv[1]
    os.chdir(tempfile.mkdtemp(prefix="trident-faults-"))
    with open("job.toml", "w") as f:
        f.write(CONFIG)
    rc = ranks_mode() if mode == "ranks" else io_mode()
    if rc == 77:
        return rc
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
