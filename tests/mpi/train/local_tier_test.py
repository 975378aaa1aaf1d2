#!/usr/bin/env python3
"""The node-local checkpoint tier (output.local_checkpoint_dir,
output.local_checkpoint_every) on the 4-rank small mesh placed on two
virtual nodes of this host (topology.nodes = 2, devices_per_node = 2):

- every rank's shard lies in its node's directory and a byte-identical copy
  in its partner's, on the other node; each node has its own index;
  /metrics/checkpoints has the local saves (local = 1) beside the shared;
- a job killed after local step 6 (shared step 4) whose node v1's directory
  is then deleted resumes, as slurm/trident.sbatch's restart does, from
  local step 6 through the partner copies on v0, and ends bit for bit where
  an uninterrupted job without the tier ends (losses and final checkpoint);
  its restart event says "local tier";
- the same with the partner copy of one of v1's shards deleted too: one
  line says why the local tier is passed over, the job resumes from the
  shared step 4 and ends bit for bit as well;
- one node: the run says it keeps no partner copies and keeps none;
- a clean finish removes the tier; both keys or neither, and a directory
  that cannot be made: exit 2, one line (and no run file).
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

from mpirun_cli import check, checkpoint_job, checkpoint_tensors, launch, verdict

ANALYSIS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "share",
                        "trident", "analysis")
STEPS = 8
CONFIG = checkpoint_job(STEPS, checkpoint_every=4)


def run(name, sets=(), env=None, nodes=2):
    args = ["job.toml", "--output", name + ".h5"]
    topology = ["topology.nodes=%d" % nodes, "topology.devices_per_node=%d" % (4 // nodes),
                "topology.nvlink_domain=%d" % (4 // nodes)]
    for s in topology + list(sets):
        args += ["--set", s]
    e = {"SLURM_JOB_ID": ""}
    e.update(env or {})
    rc, out, err, _ = launch(4, args, e, timeout=240)
    return rc, out, err


def losses(name):
    with h5py.File(name + ".h5", "r") as f:
        return {int(r["step"]): float(r["loss"]) for r in f["metrics/steps"][:]}


def equal(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def node_dirs(local):
    """The job's node directories: {"v0": path, "v1": path}."""
    return {os.path.basename(d).rsplit("_", 1)[-1]: d
            for d in sorted(glob.glob(os.path.join(local, "trident-run", "*")))}


def interrupted(tag, async_=False, kill_at=6):
    """A job killed at the start of step 6 (rank 3): local step 6 committed,
    shared step 4. Returns its local tier."""
    local = os.path.abspath("local_" + tag)
    sets = ["output.checkpoint_dir=ck_" + tag, "output.local_checkpoint_dir=" + local,
            "output.local_checkpoint_every=1", "output.checkpoint_async=%s" % str(async_).lower()]
    rc, out, err = run("killed_" + tag, sets,
                       env={"TRIDENT_TEST_KILL_AT_STEP": str(kill_at), "TRIDENT_TEST_RANK": "3"})
    check(rc != 0, "%s: the job killed at step %d fails (rc=%d)" % (tag, kill_at, rc))
    return local, sets


def restart(tag, sets):
    env = {"TRIDENT_RESTART_ATTEMPT": "1", "TRIDENT_RESTART_NODE": "v1",
           "TRIDENT_RESTART_FAILED_AT": "%.3f" % time.time(), "TRIDENT_RESTART_LAST_STEP": "5"}
    return run("resumed_" + tag, sets, env=env)


def restart_event(name):
    with h5py.File(name + ".h5", "r") as f:
        rows = [r for r in f["events"][:] if r["kind"].decode().strip("\0") == "restart"] \
            if "events" in f else []
    return rows[0] if rows else None


def same_as_reference(tag, full, final):
    got = losses("resumed_" + tag)
    check(sorted(got) == [6, 7] and all(got[s] == full[s] for s in got) if tag == "local" else
          sorted(got) == [4, 5, 6, 7] and all(got[s] == full[s] for s in got),
          "%s: the resumed job's losses equal the uninterrupted job's bit for bit: %s" % (tag, got))
    check(equal(checkpoint_tensors("ck_%s/%s" % (tag, final)), checkpoint_tensors("ck_ref/" + final)),
          "%s: the final checkpoint equals the uninterrupted job's bit for bit" % tag)


def layout(local):
    """After the kill: each node holds its ranks' shards, its partners'
    copies (the other node's ranks) and its own index of step 6."""
    dirs = node_dirs(local)
    check(sorted(dirs) == ["v0", "v1"], "a directory per virtual node: %s" % sorted(dirs))
    if sorted(dirs) != ["v0", "v1"]:
        return dirs
    for node, ranks in (("v0", {0, 1, 2, 3}), ("v1", {0, 1, 2, 3})):
        names = sorted(os.listdir(dirs[node]))
        shards = {int(n.split(".shard")[1][:5]) for n in names if ".shard" in n}
        check(shards == ranks and "ckpt_step_00000006.h5" in names and
              all(n.startswith("ckpt_step_00000006") for n in names),
              "node %s holds step 6 only: its ranks' shards, the other node's copies, an index: %s"
              % (node, names))
    for n in os.listdir(dirs["v0"]):
        if ".shard" in n:
            a = open(os.path.join(dirs["v0"], n), "rb").read()
            b = open(os.path.join(dirs["v1"], n), "rb").read()
            check(a == b, "%s: the partner copy is byte-identical to the shard" % n)
    return dirs


def main():
    os.chdir(tempfile.mkdtemp(prefix="trident-local-"))
    with open("job.toml", "w") as f:
        f.write(CONFIG)
    final = "ckpt_step_%08d.h5" % STEPS

    rc, out, err = run("ref", ["output.checkpoint_dir=ck_ref"])
    check(rc == 0, "the uninterrupted job without the tier exits 0 (rc=%d) %s" % (rc, err[-300:]))
    full = losses("ref")

    # 1. a clean run with the tier: partner copies, rows, cleaned at the end
    rc, out, err = run("clean", ["output.checkpoint_dir=ck_clean", "output.local_checkpoint_dir=lt",
                                 "output.local_checkpoint_every=1"])
    check(rc == 0 and "each rank's shard copied to a partner on the next node" in out,
          "a run with the tier exits 0 and names its partners (rc=%d) %s" % (rc, err[-300:]))
    with h5py.File("clean.h5", "r") as f:
        rows = f["metrics/checkpoints"][:]
    local_steps = [int(r["step"]) for r in rows if int(r["local"]) == 1]
    check(local_steps == [1, 2, 3, 5, 6, 7] and
          [int(r["step"]) for r in rows if int(r["local"]) == 0] == [4, 8],
          "/metrics/checkpoints: local saves at 1-3 and 5-7, shared at 4 and 8: %s" % local_steps)
    for r in rows:
        print("  save at step %d (%s): blocking %.4f s, write %.4f s, %d bytes"
              % (r["step"], "local" if r["local"] else "shared", r["blocking_s"], r["write_s"],
                 r["bytes"]))
    check(losses("clean") == full, "the local saves leave the losses as they were")
    check(not os.path.exists("lt/trident-run"), "a clean finish removes the tier's job directory")

    # 2. node v1 lost: its directory deleted; resumed through the partner copies
    local, sets = interrupted("local")
    dirs = layout(local)
    shutil.rmtree(dirs.get("v1", "/nonexistent"), ignore_errors=True)
    rc, out, err = restart("local", sets)
    check(rc == 0 and "resuming from the local tier: step 6" in out,
          "resumed from local step 6 without node v1's directory (rc=%d) %s %s"
          % (rc, out[-300:], err[-300:]))
    moved = [l for l in out.splitlines() if l.startswith("resuming from the local tier: step 6")]
    n = int(moved[0].split("(")[1].split()[0]) if moved else -1
    check(0 < n < 5, "the restore moved the index and the shards v1's ranks read, not the step's "
          "5 files (index + 4 shards): %s" % moved)
    ev = restart_event("resumed_local")
    check(ev is not None and "local tier" in ev["detail"].decode() and int(ev["reference"]) == 0,
          "the restart event says the local tier, no step lost: %s" % (ev,))
    whole = "node v1 left out; resumed from the local tier: " + os.path.join(
        dirs.get("v0", "?"), "ckpt_step_00000006.h5")
    check(ev is not None and ev["detail"].decode().strip("\0") == whole and len(whole) > 96,
          "the restart event's detail is whole (%d bytes, run file format_version 3): %s"
          % (len(whole), ev["detail"] if ev is not None else None))
    same_as_reference("local", full, final)
    r = subprocess.run([sys.executable, "-m", "trident_analyze", "summary", "resumed_local.h5"],
                       env=dict(os.environ, PYTHONPATH=ANALYSIS), capture_output=True, text=True)
    check(r.returncode == 0 and "restart       at step 6: from the local checkpoint, 0 step(s) lost"
          in r.stdout, "trident-analyze summary lists the restart: %s" % (r.stdout + r.stderr)[-400:])

    # 2b. the same with async saves (the copies move between step boundaries):
    # killed at step 7, the newest committed local step is 5 or 6
    local, sets = interrupted("async", async_=True, kill_at=7)
    shutil.rmtree(node_dirs(local).get("v1", "/nonexistent"), ignore_errors=True)
    rc, out, err = restart("async", sets)
    at = [l for l in out.splitlines() if l.startswith("resuming from the local tier: step ")]
    check(rc == 0 and at and at[0].split()[6].rstrip(",") in ("5", "6"),
          "async: resumed from local step 5 or 6 without node v1's directory (rc=%d) %s %s"
          % (rc, at, err[-300:]))
    check(equal(checkpoint_tensors("ck_async/" + final), checkpoint_tensors("ck_ref/" + final)),
          "async: the final checkpoint equals the uninterrupted job's bit for bit")
    got = losses("resumed_async")
    check(got and all(got[s] == full[s] for s in got), "async: the resumed losses equal the "
          "uninterrupted job's bit for bit: %s" % got)

    # 3. a partner copy lost too: the shared step 4, with one line
    local, sets = interrupted("shared")
    dirs = node_dirs(local)
    shutil.rmtree(dirs.get("v1", "/nonexistent"), ignore_errors=True)
    for p in glob.glob(os.path.join(dirs.get("v0", "/nonexistent"), "*.shard00002.h5")):
        os.remove(p)
    rc, out, err = restart("shared", sets)
    why = [l for l in err.splitlines() if "not resuming from the local tier" in l]
    check(rc == 0 and len(why) == 1 and "shard00002.h5" in why[0] and
          "resuming from the shared checkpoint directory" in why[0],
          "a partner copy missing too: one line names the shard, the shared directory instead: %s"
          % why)
    ev = restart_event("resumed_shared")
    check(ev is not None and "shared checkpoint directory" in ev["detail"].decode() and
          int(ev["reference"]) == 2, "the restart event says the shared directory, 2 steps lost: %s"
          % (ev,))
    same_as_reference("shared", full, final)

    # 4. one node: no partner copies
    rc, out, err = run("one", ["output.checkpoint_dir=ck_one", "output.local_checkpoint_dir=l1",
                               "output.local_checkpoint_every=3"], nodes=1,
                       env={"TRIDENT_TEST_KILL_AT_STEP": "7", "TRIDENT_TEST_RANK": "0"})
    shards = [n for d in glob.glob("l1/trident-run/*") for n in os.listdir(d) if ".shard" in n]
    check("one node: no partner copies" in out and len(shards) == 4,
          "one node: the run says so and keeps its 4 shards only: %s" % shards)

    # 5. both keys or neither
    rc, out, err = run("bad", ["output.local_checkpoint_dir=l2"])
    lines = [l for l in err.splitlines() if l.startswith("trident: error")]
    check(rc == 2 and len(lines) == 1 and "output.local_checkpoint_every" in lines[0],
          "local_checkpoint_dir without local_checkpoint_every: exit 2, one line: %s" % lines)
    rc, out, err = run("bad2", ["output.local_checkpoint_dir=/proc/trident-nope",
                                "output.local_checkpoint_every=1"])
    lines = [l for l in err.splitlines() if l.startswith("trident: error")]
    check(rc == 2 and len(lines) == 1 and "cannot create /proc/trident-nope" in lines[0] and
          not os.path.exists("bad2.h5"),
          "a local directory that cannot be made: exit 2, one line, no run file: %s" % lines)
    rc = verdict()
    if rc == 0:  # a failure's files stay for a look (~18 MB)
        work = os.getcwd()
        os.chdir("/")
        shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
