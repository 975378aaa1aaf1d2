#!/usr/bin/env python3
"""Sharded and async checkpoints (output.checkpoint_format = "sharded", the
default; output.checkpoint_async) end to end on the 4-rank small mesh
(pp = 2, cp = 2, ep = 2):

- the index read with h5py from a copy of the folder equals a "single"
  checkpoint of the same run bit for bit; every shard dataset's fnv1a64 is
  its bytes'; each rank's shard holds only slices it owns and every slice
  is written once; replicas share the writing;
- async saves give the same bits as sync ones, and /metrics/checkpoints
  has a row per save;
- trident convert to-hf and trident eval give the same from both formats;
- SIGKILL of every rank in each phase of a save (shard files created;
  shards durable, not agreed; agreed, index not renamed), sync and async:
  --resume takes the previous checkpoint, names the save it passed over,
  and ends where the uninterrupted run ends, bit for bit;
- a deleted index, a truncated shard, a flipped byte in a shard: --resume
  passes over the checkpoint naming why; --resume PATH exits 2 with one
  line naming the shard file (and the tensor, for a checksum);
- resume on other meshes (1 rank; 8 ranks with the sharded optimizer) and
  back, within 1e-4 of the uninterrupted run;
- output.keep_checkpoints keeps the newest K, index and shards, no others.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import (BIN, MPIRUN, check, checkpoint_job, checkpoint_names, checkpoint_tensors,
                        launch, verdict)

STEPS = 6
CONFIG = checkpoint_job(STEPS, checkpoint_every=2)


def run(np_, name, sets=(), extra=(), env=None):
    args = ["job.toml", "--output", name + ".h5"] + list(extra)
    topology = ["topology.nodes=1", "topology.devices_per_node=%d" % np_,
                "topology.nvlink_domain=%d" % min(np_, 4)]
    for s in topology + list(sets):
        args += ["--set", s]
    rc, out, err, _ = launch(np_, args, env, timeout=240)
    return rc, out, err


def losses(name):
    with h5py.File(name + ".h5", "r") as f:
        return {int(r["step"]): float(r["loss"]) for r in f["metrics/steps"][:]}


def fnv1a64(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def equal(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def error_lines(err):
    return [l for l in err.splitlines() if l.startswith("trident: error")]


def check_shards(index):
    """Every shard dataset's checksum, and every slice written exactly once."""
    d = os.path.dirname(index)
    with h5py.File(index, "r") as f:
        shards = [s.decode() if isinstance(s, bytes) else s for s in f.attrs["shards"]]
        pieces = {}
        f["tensors"].visititems(lambda n, o: pieces.__setitem__(n, o.attrs["pieces"])
                                if isinstance(o, h5py.Dataset) else None)
    bad, written = [], {}
    for r, s in enumerate(shards):
        with h5py.File(os.path.join(d, s), "r") as g:
            check(int(g.attrs["rank"]) == r and "%08d" % int(g.attrs["step"]) in s and
                  int(g.attrs["complete"]) == 1,
                  "shard %s: its rank, the step's 8 digits in its name, complete" % s)
            written[r] = 0

            def visit(n, o):
                if not isinstance(o, h5py.Dataset):
                    return
                data = o[()]
                written[r] += data.nbytes
                if fnv1a64(data.tobytes()) != int(o.attrs["fnv1a64"]):
                    bad.append(s + ":" + n)
            g["tensors"].visititems(visit)
    check(not bad, "every shard dataset's fnv1a64 is its bytes' (%s)" % bad[:3])
    tiled = True
    for name, p in pieces.items():
        ranges = sorted((int(p[i + 1]), int(p[i + 2])) for i in range(0, len(p), 3))
        tiled &= all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))
    check(tiled, "every tensor's slices tile it once (%d tensors)" % len(pieces))
    return written


def tools_read_both_formats(final):
    """trident eval --logits-out and trident convert to-hf give the same bits
    from a sharded checkpoint as from a single file of the same run."""
    np.arange(2 * 32 + 1, dtype=np.uint16).__imod__(32).tofile("toks.bin")
    topo = ["--set", "topology.nodes=1", "--set", "topology.devices_per_node=4",
            "--set", "topology.nvlink_domain=4"]
    logits = {}
    for tag, ck in (("sharded", "ck_s"), ("single", "ck_1")):
        e = subprocess.run(MPIRUN + ["-np", "4", BIN, "eval", "job.toml", "--checkpoint",
                                     "%s/%s" % (ck, final), "--tokens", "toks.bin", "--logits-out",
                                     "logits_%s.h5" % tag] + topo,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        check(e.returncode == 0, "trident eval of the %s checkpoint exits 0 %s" % (tag, e.stderr[-300:]))
        if e.returncode == 0:
            with h5py.File("logits_%s.h5" % tag, "r") as f:
                logits[tag] = f["logits"][()]
    check(len(logits) == 2 and np.array_equal(logits["sharded"], logits["single"]),
          "trident eval: the same logits from both formats")
    # convert to-hf knows the softmax router only: a short run of that model
    for tag, fmt in (("sharded", "sharded"), ("single", "single")):
        rc, out, err = run(4, "soft_" + tag, ["model.router=softmax", "train.steps=2",
                                              "output.checkpoint_dir=ck_soft_" + tag,
                                              "output.checkpoint_format=" + fmt])
        p = subprocess.run([BIN, "convert", "to-hf", "ck_soft_%s/ckpt_step_00000002.h5" % tag,
                            "--out", "hf_" + tag], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
        check(rc == 0 and p.returncode == 0, "convert to-hf of the %s checkpoint exits 0 %s"
              % (tag, p.stderr[-300:]))
    names = sorted(os.listdir("hf_single")) if os.path.isdir("hf_single") else []
    same = os.path.isdir("hf_sharded") and names == sorted(os.listdir("hf_sharded")) and all(
        open(os.path.join("hf_sharded", n), "rb").read() == open(os.path.join("hf_single", n), "rb").read()
        for n in names)
    check(same, "convert to-hf: the same files from both formats: %s" % names)


def main():
    os.chdir(tempfile.mkdtemp(prefix="trident-ckpt-"))
    with open("job.toml", "w") as f:
        f.write(CONFIG)

    # 1. sharded (sync), single and async runs of the same job
    rc, out, err = run(4, "sharded", ["output.checkpoint_dir=ck_s"])
    check(rc == 0, "sharded run exits 0 (rc=%d) %s" % (rc, err[-300:]))
    rc, out, err = run(4, "single", ["output.checkpoint_dir=ck_1", "output.checkpoint_format=single"])
    check(rc == 0, "single run exits 0 (rc=%d) %s" % (rc, err[-300:]))
    rc, out, err = run(4, "async", ["output.checkpoint_dir=ck_a", "output.checkpoint_async=true",
                                    "output.checkpoint_staging_mb=1"])
    check(rc == 0, "async run exits 0 (rc=%d) %s" % (rc, err[-300:]))
    final = "ckpt_step_%08d.h5" % STEPS
    shutil.copytree("ck_s", "elsewhere/moved")
    moved = checkpoint_tensors("elsewhere/moved/" + final)
    single = checkpoint_tensors("ck_1/" + final)
    check(equal(moved, single), "the sharded index, read with h5py from a copied folder, equals the "
          "single file bit for bit (%d tensors)" % len(single))
    check(equal(checkpoint_tensors("ck_a/" + final), single), "async equals sync bit for bit")
    with h5py.File("elsewhere/moved/" + final, "r") as f:
        check(int(f.attrs["format_version"]) == 3, "the index is format_version 3")
    with h5py.File("ck_1/" + final, "r") as f:
        check(int(f.attrs["format_version"]) == 2, "the single file stays format_version 2")
    written = check_shards("ck_s/" + final)
    # ranks {0,1} hold stage 0, {2,3} stage 1 (cp x ep replicas of a stage)
    for a, b in ((0, 1), (2, 3)):
        ratio = max(written[a], written[b]) / max(1, min(written[a], written[b]))
        check(ratio < 1.2, "replicas %d and %d write about the same bytes (%d, %d)"
              % (a, b, written[a], written[b]))
    for name in ("sharded", "async"):
        with h5py.File(name + ".h5", "r") as f:
            rows = f["metrics/checkpoints"][:]
        check([int(r["step"]) for r in rows] == [2, 4, 6] and all(r["bytes"] > 0 for r in rows) and
              all(int(r["async"]) == (name == "async") for r in rows),
              "%s: /metrics/checkpoints has a row per save: %s" % (name, rows))
    full = losses("sharded")

    tools_read_both_formats(final)

    # 2. SIGKILL of every rank in each phase of the save at step 4
    for phase, rank in (("staged", "-1"), ("shards", "-1"), ("index", "0")):
        for mode in ("sync", "async"):
            ck = "ck_kill_%s_%s" % (phase, mode)
            sets = ["output.checkpoint_dir=" + ck, "output.checkpoint_async=%s" % str(mode == "async").lower()]
            env = {"TRIDENT_TEST_KILL_IN_SAVE": phase, "TRIDENT_TEST_KILL_IN_SAVE_STEP": "4",
                   "TRIDENT_TEST_RANK": rank}
            rc, out, err = run(4, ck, sets, env=env)
            check(rc != 0 and checkpoint_names(ck)[-1:] == ["ckpt_step_00000002.h5"],
                  "killed in phase %s (%s): the newest complete checkpoint is step 2 (rc=%d, %s)"
                  % (phase, mode, rc, checkpoint_names(ck)))
            rc, out, err = run(4, ck + "_r", sets, ["--resume"])
            warn = [l for l in err.splitlines() if "not resuming from step 4" in l]
            check(rc == 0 and "resumed from %s/ckpt_step_00000002.h5" % ck in out,
                  "killed in phase %s (%s): --resume takes step 2 (rc=%d) %s" % (phase, mode, rc, err[-200:]))
            check(len(warn) == 1 and "no index" in warn[0],
                  "killed in phase %s (%s): the unfinished save is named: %s" % (phase, mode, warn))
            if rc == 0:
                got = losses(ck + "_r")
                check(all(got[s] == full[s] for s in range(2, STEPS)) and
                      equal(checkpoint_tensors("%s/%s" % (ck, final)), single),
                      "killed in phase %s (%s): resumed bit for bit to the end" % (phase, mode))
                stray = [n for n in os.listdir(ck) if ".tmp" in n or
                         (n.startswith("ckpt_step_00000004.") and n != "ckpt_step_00000004.h5" and
                          not any(n in s for s in shard_names("%s/ckpt_step_00000004.h5" % ck)))]
                check(not stray, "killed in phase %s (%s): the interrupted save's files are "
                      "gone once a newer save commits: %s" % (phase, mode, stray))

    # 3. damaged checkpoints: passed over by --resume, exit 2 for --resume PATH
    def damaged(tag, damage, expect):
        ck = "ck_dmg_" + tag
        shutil.copytree("ck_s", ck)
        newest = "%s/ckpt_step_%08d.h5" % (ck, STEPS)
        shards = shard_names(newest)
        damage(newest, shards)
        lines = []
        if tag != "no-index":  # (first: the --resume below saves step 6 anew)
            rc, out, err = run(4, ck + "_p", ["output.checkpoint_dir=" + ck + "_x"], ["--resume", newest])
            lines = error_lines(err)
            check(rc == 2 and len(lines) == 1 and expect in lines[0] and ".shard" in lines[0],
                  "%s: --resume PATH exits 2 with one line naming the shard file (rc=%d): %s"
                  % (tag, rc, lines))
        rc, out, err = run(4, ck, ["output.checkpoint_dir=" + ck, "train.steps=%d" % (STEPS + 1)],
                           ["--resume"])
        warn = [l for l in err.splitlines() if "warning: not resuming from" in l]
        check(rc == 0 and "resumed from %s/ckpt_step_00000004.h5" % ck in out,
              "%s: --resume passes over it to step 4 (rc=%d) %s" % (tag, rc, err[-300:]))
        check(len(warn) == 1 and expect in warn[0], "%s: named with '%s': %s" % (tag, expect, warn))
        return lines

    def drop_index(newest, shards):
        os.remove(newest)

    def truncate(newest, shards):
        data = open(shards[2], "rb").read()
        open(shards[2], "wb").write(data[: len(data) // 2])

    def flip(newest, shards):
        with h5py.File(shards[3], "r") as g:
            off = g["tensors/param/lm_head"].id.get_offset()
        with open(shards[3], "r+b") as f:
            f.seek(off + 8)
            b = f.read(4)
            f.seek(off + 8)
            f.write(bytes(x ^ 0x5A for x in b))

    damaged("no-index", drop_index, "has shards and no index")
    damaged("truncated", truncate, "truncated")
    lines = damaged("flipped", flip, "fails its checksum")
    check(lines and "param/lm_head" in lines[0], "flipped: the line names the tensor: %s" % lines)

    # 4. resume on other meshes, with and without the sharded optimizer
    one = ["parallel.pp=1", "parallel.cp=1", "parallel.ep=1"]
    # dp = 2: half the micro-batches per replica keeps the global batch
    eight = ["parallel.pp=2", "parallel.cp=2", "parallel.ep=2", "train.optimizer_sharding=dp",
             "data.num_microbatches=1"]
    for np_, mesh, tag in ((1, one, "np1"), (8, eight, "np8-zero")):
        ck = "ck_mesh_" + tag
        shutil.copytree("ck_s", ck)
        os.remove("%s/ckpt_step_%08d.h5" % (ck, STEPS))
        os.remove("%s/ckpt_step_00000004.h5" % ck)
        rc, out, err = run(np_, ck, ["output.checkpoint_dir=" + ck] + mesh, ["--resume"])
        got = losses(ck) if rc == 0 else {}
        worst = max((abs(got[s] - full[s]) / abs(full[s]) for s in range(2, STEPS)), default=1)
        check(rc == 0 and worst <= 1e-4, "4-rank checkpoint resumed on %s: losses within 1e-4 "
              "(worst %.1e, rc=%d) %s" % (tag, worst, rc, err[-200:]))
    # and back: the 8-rank sharded-optimizer save of step 4 resumed on the 4-rank mesh
    ck = "ck_mesh_np8-zero"
    for n in os.listdir(ck):
        if n.startswith("ckpt_step_0000000%d" % STEPS) or n.startswith("ckpt_step_00000002"):
            os.remove(os.path.join(ck, n))
    rc, out, err = run(4, "back", ["output.checkpoint_dir=" + ck], ["--resume"])
    got = losses("back") if rc == 0 else {}
    worst = max((abs(got[s] - full[s]) / abs(full[s]) for s in range(4, STEPS)), default=1)
    check(rc == 0 and "ckpt_step_00000004.h5" in out and worst <= 1e-4,
          "8-rank sharded-optimizer checkpoint resumed on 4 ranks: within 1e-4 (worst %.1e, rc=%d)"
          % (worst, rc))

    # 5. retention: the newest 2, index and shards, nothing else
    rc, out, err = run(4, "keep", ["output.checkpoint_dir=ck_keep", "output.checkpoint_every=1",
                                   "output.keep_checkpoints=2"])
    names = checkpoint_names("ck_keep")
    files = sorted(os.listdir("ck_keep"))
    want = sorted(["ckpt_step_00000005.h5", "ckpt_step_00000006.h5"] +
                  [os.path.basename(s) for n in names for s in shard_names("ck_keep/" + n)])
    check(rc == 0 and names == want[:0] + ["ckpt_step_00000005.h5", "ckpt_step_00000006.h5"] and
          files == want, "keep_checkpoints = 2: steps 5 and 6 and their shards only: %s" % files)
    return verdict()


def shard_names(index):
    with h5py.File(index, "r") as f:
        return [os.path.join(os.path.dirname(index), s.decode() if isinstance(s, bytes) else s)
                for s in f.attrs["shards"]]


if __name__ == "__main__":
    sys.exit(main())
