#!/usr/bin/env python3
"""Failures of `trident run` that must end every rank quickly with one line
from the rank that knows the cause, and no MPI_Abort banner or library
backtrace (4 ranks under mpirun).

  faults_test.py ranks: a SIGSTOPped rank (the others' deadline fires, one
      message naming the peer its reporter waited on, every rank gone within
      the deadline of the stop); a checkpoint damaged where only some ranks
      read (exit 2 at once, one line); --resume and a Slurm restart passing
      over a truncated newest checkpoint, each named in the warning.
  faults_test.py io: a full and a read-only checkpoint directory, one that
      fills at the second checkpoint, a read-only run-file directory, and a
      run file whose file system fills mid-run (small tmpfs mounts; exit 77 =
      SKIP with the reason where mounting is not allowed).
"""
import os
import re
import subprocess
import sys
import tempfile
import time

import h5py

from mpirun_cli import BIN, MPIRUN, SMALL_MESH, check, checkpoint_names, launch, verdict
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


def stopped_rank(marker):
    """Pid of a process of ours in state T (stopped) whose command line holds
    marker, or None."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open("/proc/%s/stat" % pid) as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "T":
                    return int(pid)
        except OSError:
            continue
    return None


def run_until_stop(args, env, marker, timeout=120):
    """Like run(), and also the seconds from the moment a rank was seen
    stopped to the job's end (None if no rank was seen stopped): start-up on
    a loaded 2-core machine varies by many seconds, the deadline does not."""
    e = dict(os.environ)
    e.update(env)
    p = subprocess.Popen(MPIRUN + ["-np", str(NP), BIN, "run", "job.toml"] + args, env=e,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # stderr and stdout are small here (a few lines): reading them at the end
    # cannot block the job
    stopped_at = None
    t_end = time.time() + timeout
    while p.poll() is None and time.time() < t_end:
        if stopped_at is None and stopped_rank(marker) is not None:
            stopped_at = time.time()
        time.sleep(0.1)
    if p.poll() is None:
        p.kill()
    out, err = p.communicate()
    ended = time.time()
    return p.returncode, out, err, (ended - stopped_at) if stopped_at else None


def ranks_mode():
    # 1. rank 2 stops itself (SIGSTOP) at step 3: its peers' waits time out.
    #    The run file's name tells this job's ranks from any other's on the
    #    machine (another checkout may run this test at the same time).
    marker = "stop-%d.h5" % os.getpid()
    rc, out, err, after_stop = run_until_stop(
        ["--output", marker, "--set", "output.checkpoint_dir=ck_stop"],
        {"TRIDENT_TEST_RANK": "2", "TRIDENT_TEST_STOP_AT_STEP": "3"}, marker)
    check(rc == 1, "SIGSTOPped rank: exit 1 (rc=%d)" % rc)
    line = one_error_line(err, "SIGSTOPped rank")
    # The rank that reports is one whose deadline passed first: it names the
    # peer it waited on, which is rank 2 or a rank waiting on rank 2.
    peer = re.search(r"\(world (\d+), tag \d+\)", line)
    check("timed out after %ds" % TIMEOUT_S in line and peer is not None and
          "the peer this rank waited on" in line,
          "SIGSTOPped rank: the line names the timeout and the peer it waited on as such: " + line)
    # That peer may be waiting in turn; the ranks that do not answer a probe
    # are named, and the stopped rank is among them.
    silent = re.search(r"ranks? ([0-9, ]+) did not answer", line)
    check(silent is not None and 2 in [int(r) for r in silent.group(1).split(",")],
          "SIGSTOPped rank: the line names rank 2 among the ranks that did not answer: " + line)
    # the deadline, 2 s of probing, 1 s for the others to end, and the
    # launcher's teardown; measured from the stop, so a slow start-up does
    # not count
    check(after_stop is not None and after_stop < TIMEOUT_S + 8,
          "SIGSTOPped rank: the job ended %s s after a rank stopped (deadline %d s)"
          % ("%.1f" % after_stop if after_stop is not None else "?", TIMEOUT_S))
    left = subprocess.run(["pgrep", "-f", marker], stdout=subprocess.PIPE, text=True).stdout
    check(not left.strip(), "SIGSTOPped rank: no rank left running: %s" % left.split())

    # 2. a full run for checkpoints, then one tensor damaged that only the
    #    ranks of pipeline stage 1 (layers 2-3) read
    # (one gathered file, format 2: the byte offsets below are its datasets';
    # the sharded format's damage is train_checkpoints')
    rc, out, err, _ = run(["--output", "full.h5", "--set", "output.checkpoint_dir=ck",
                           "--set", "output.checkpoint_format=single"])
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
    ck = checkpoint_names("ck")
    newest = "ck/" + ck[-1]
    data = open(newest, "rb").read()
    open(newest, "wb").write(data[: len(data) // 2])
    rc, out, err, _ = run(["--output", "res.h5", "--set", "output.checkpoint_dir=ck", "--resume"])
    check(rc == 0, "resume past a truncated checkpoint: exit 0 (rc=%d) %s" % (rc, err[-300:]))
    warn = [l for l in err.splitlines() if l.startswith("trident: warning: not resuming from")]
    check(len(warn) == 1 and ck[-1] in warn[0], "the truncated checkpoint is named: %s" % warn)
    check("resumed from ck/%s" % ck[-2] in out, "resumed from the one before: " +
          "".join(l for l in out.splitlines() if l.startswith("resumed")))
    check("(--resume)" in warn[0] if warn else False, "the warning says --resume asked: %s" % warn)

    # 4. the same after a Slurm requeue (no --resume): the warning says so
    open(newest, "wb").write(data[: len(data) // 2])
    rc, out, err, _ = run(["--output", "req.h5", "--set", "output.checkpoint_dir=ck"],
                          env={"SLURM_RESTART_COUNT": "1"})
    check(rc == 0, "Slurm restart past a truncated checkpoint: exit 0 (rc=%d) %s" % (rc, err[-300:]))
    warn = [l for l in err.splitlines() if l.startswith("trident: warning: not resuming from")]
    check(len(warn) == 1 and "(Slurm restart, SLURM_RESTART_COUNT=1)" in warn[0] and
          "--resume" not in warn[0], "the warning names the Slurm restart, not --resume: %s" % warn)


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
        check("no earlier checkpoint in full/ck" in line and "is kept" not in line,
              "full: the first checkpoint's failure says none is kept: " + line)
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
        # room for one checkpoint (about 1.5 MB in shards and index; each
        # shard asks for its host's whole save, metadata counted generously,
        # before it writes) but not for the next
        ok_one, why_one = mount_tmpfs("one", "3m")
        check(ok_one, "3 MB tmpfs mounted (%s)" % why_one)
        rc, out, err, _ = run(["--output", "c.h5", "--set", "output.checkpoint_dir=one/ck"])
        check(rc == 1, "checkpoint directory full at the second checkpoint: exit 1 (rc=%d)" % rc)
        line = one_error_line(err, "checkpoint directory full at the second checkpoint")
        check("one/ck/ckpt_step_00000004.h5" in line and "No space left on device" in line and
              "the previous checkpoint, one/ck/ckpt_step_00000002.h5, is kept" in line,
              "second checkpoint: the line names the file, the reason and the kept one: " + line)
        # the same in the background (output.checkpoint_async): the failed save
        # of step 4 ends the run at the next step boundary, after step 4 ran
        for n in os.listdir("one/ck"):
            os.remove(os.path.join("one/ck", n))
        rc, out, err, _ = run(["--output", "c2.h5", "--set", "output.checkpoint_dir=one/ck",
                               "--set", "output.checkpoint_async=true"])
        line = one_error_line(err, "async: checkpoint directory full at the second checkpoint")
        check(rc == 1 and "one/ck/ckpt_step_00000004.h5" in line and "No space left on device" in line
              and "the previous checkpoint, one/ck/ckpt_step_00000002.h5, is kept" in line,
              "async, second checkpoint: exit 1 (rc=%d), one line naming the file, the reason and "
              "the kept one: %s" % (rc, line))
        check("step     4 |" in out and "step     5 |" not in out,
              "async: the failure ended the run at the next step boundary (after step 4)")
        # the run file's own file system fills up in the middle of the run
        ok_rf, why_rf = mount_tmpfs("runfs", "96k")
        check(ok_rf, "96 kB tmpfs mounted (%s)" % why_rf)
        rc, out, err, _ = run(["--output", "runfs/run.h5", "--set", "output.checkpoint_dir=ck3",
                               "--set", "output.timeline=true", "--set", "train.steps=200"])
        check(rc == 1, "run file's file system full mid-run: exit 1 (rc=%d)" % rc)
        line = one_error_line(err, "run file's file system full mid-run")
        check("output file runfs/run.h5: cannot write" in line and
              "No space left on device" in line and "HDF5" not in line and "MPI" not in line,
              "run file full: one line naming the file and the system's reason: " + line)
        check("step     1 |" in out, "run file full: it failed in the middle of the run, "
              "after the first steps")
    finally:
        for m in ("full", "ro", "one", "runfs"):
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
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
