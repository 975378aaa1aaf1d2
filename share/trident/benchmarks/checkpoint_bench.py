#!/usr/bin/env python3
"""The checkpoint benchmark (issue 42): one 4-rank model (checkpoint-4rank.toml,
a 2.5 GB state), saved as one gathered file ("single", format 2), sharded
("sharded", format 3) and sharded in the background (checkpoint_async), side
by side in one run; then the sharded checkpoint resumed on 4, 2 and 8 ranks.

Per mode: every rank's peak RSS (/ranks/summary), rank 0's against the median
rank's; per save (/metrics/checkpoints): the seconds training stopped, the
seconds to durable and the GB/s that makes; per resume: resume_load_s and
the GB/s of the bytes read. A benchmark, not a test: it prints a table and
exits 0 unless a job failed. Which figures move with the machine's load: the
seconds and GB/s (the disk and page cache are shared); the RSS ratios do not.

  checkpoint_bench.py --bin build/trident [--dir /tmp/ckbench] [--mpirun "mpirun ..."]
"""
import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = ("mpirun --allow-run-as-root --oversubscribe --mca pml ucx --mca pml_ucx_devices any "
          "--mca pml_ucx_tls any")


def run(a, np_, out, sets, extra=()):
    cmd = shlex.split(a.mpirun) + ["-np", str(np_), a.bin, "run", a.config, "--output", out]
    cmd += list(extra)
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        print("job failed (rc=%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
        sys.exit(1)


def rss(path):
    with h5py.File(path, "r") as f:
        rows = f["ranks/summary"][:]
    by_rank = {int(r["rank"]): float(r["peak_rss_bytes"]) for r in rows}
    return by_rank[0], statistics.median(by_rank.values()), max(by_rank.values())


def saves(path):
    with h5py.File(path, "r") as f:
        rows = f["metrics/checkpoints"][:]
        steps = f["metrics/steps"][:]
    return rows, [float(s["step_time_s"]) for s in steps]


def mesh(np_):
    topo = ["topology.nodes=1", "topology.devices_per_node=%d" % np_,
            "topology.nvlink_domain=%d" % min(np_, 4)]
    if np_ == 2:  # pp = 2 alone; the global batch stays 4 sequences
        return topo + ["parallel.pp=2", "parallel.ep=1", "data.num_microbatches=4"]
    if np_ == 8:  # pp = 2 x dp = 4, ep = 2: half the micro-batches per replica
        return topo + ["parallel.pp=2", "parallel.ep=2", "data.num_microbatches=1",
                       "data.micro_batch_size=1"]
    return topo


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--dir", default="/tmp/trident-ckbench")
    ap.add_argument("--mpirun", default=MPIRUN)
    ap.add_argument("--config", default=os.path.join(HERE, "checkpoint-4rank.toml"))
    a = ap.parse_args()
    a.bin, a.config = os.path.abspath(a.bin), os.path.abspath(a.config)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    os.chdir(a.dir)
    modes = [("single", ["output.checkpoint_format=single"]),
             ("sharded", ["output.checkpoint_format=sharded"]),
             ("async", ["output.checkpoint_format=sharded", "output.checkpoint_async=true"])]
    print("%-8s %10s %10s %8s %12s %10s %9s %12s" % ("mode", "rank0 RSS", "median", "ratio",
                                                   "blocking s", "write s", "GB/s", "step s"))
    for name, sets in modes:
        run(a, 4, name + ".h5", sets + ["output.checkpoint_dir=ck_" + name])
        r0, med, _ = rss(name + ".h5")
        rows, steps = saves(name + ".h5")
        blocking = statistics.mean(float(r["blocking_s"]) for r in rows)
        write = statistics.mean(float(r["write_s"]) for r in rows)
        gbs = statistics.mean(float(r["bytes"]) / float(r["write_s"]) / 1e9 for r in rows)
        print("%-8s %8.2f GB %7.2f GB %8.2f %12.3f %10.3f %9.2f %12.3f" % (
            name, r0 / 1e9, med / 1e9, r0 / med, blocking, write, gbs, statistics.median(steps)))
        if name != "sharded":  # 2.5 GB a save: only the resumes' checkpoint is kept
            shutil.rmtree("ck_" + name)
    print()
    print("%-24s %10s %10s %8s %10s %9s" % ("resume sharded step 1", "rank0 RSS", "median",
                                          "ratio", "load s", "GB/s"))
    ck = "ck_sharded/ckpt_step_00000001.h5"
    with h5py.File("sharded.h5", "r") as f:
        state = float(f["metrics/checkpoints"][0]["bytes"])
    for np_ in (4, 2, 8):
        ckdir = "ck_resume_%d" % np_
        out = "resume%d.h5" % np_
        run(a, np_, out, mesh(np_) + ["output.checkpoint_dir=" + ckdir], ["--resume", ck])
        r0, med, _ = rss(out)
        with h5py.File(out, "r") as f:
            load = float(f.attrs["resume_load_s"])
        print("%-24s %8.2f GB %7.2f GB %8.2f %10.3f %9.2f" % (
            "on %d ranks" % np_, r0 / 1e9, med / 1e9, r0 / med, load, state / load / 1e9))
        shutil.rmtree(ckdir)
    print("\nstate: %.2f GB (parameters and both AdamW moments, all ranks)" % (state / 1e9))
    os.chdir("/")
    shutil.rmtree(a.dir)  # tens of GB of checkpoints
    return 0


if __name__ == "__main__":
    sys.exit(main())
