#!/usr/bin/env python3
"""What the per-step table costs (issue 46): the same job with
output.rank_stats_every = 10 and = 0, run alternately, side by side.

The figure is the step period: from the first timeline event of rank 0's
step k to that of step k+1, so that everything between two steps (the run
file's rows, the table's records sent and taken in, the boundary agreement)
is in it, which step_time_s (the step alone) would leave out. Per run, the
median period over the steps after the first two; per setting, the median
of its runs. Within the runs with the table, the periods of the steps that
take a window in and write its rows (steps 10, 20, ...) are set beside the
other steps': their excess over 10 steps is the table's cost per step with
the machine's drift between runs left out. A benchmark, not a test: it
prints the table and exits 0 unless a job failed.

  rank_stats_bench.py --bin build/trident [--config quickstart.toml] [--np 8]
                      [--steps 61] [--pairs 3] [--mpirun "mpirun ..."]
"""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
MPIRUN = ("mpirun --allow-run-as-root --oversubscribe --mca pml ucx --mca pml_ucx_devices any "
          "--mca pml_ucx_tls any")


def periods(path):
    """{step: seconds from rank 0's step's first event to the next step's}."""
    with h5py.File(path, "r") as f:
        ev = f["timeline/events"][()]
    ev = ev[ev["rank"] == 0]
    first = {}
    for s, t in zip(ev["step"], ev["t_begin_s"]):
        first[int(s)] = min(first.get(int(s), np.inf), float(t))
    steps = sorted(first)
    return {a: first[b] - first[a] for a, b in zip(steps, steps[1:]) if b == a + 1}


def run(a, out, every):
    cmd = shlex.split(a.mpirun) + ["-np", str(a.np), a.bin, "run", a.config, "--output", out,
                                   "--set", "train.steps=%d" % a.steps,
                                   "--set", "output.rank_stats_every=%d" % every]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        print("job failed (rc=%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
        sys.exit(1)
    return periods(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--config", default=os.path.join(HERE, "..", "examples", "quickstart.toml"))
    ap.add_argument("--np", type=int, default=8)
    ap.add_argument("--steps", type=int, default=61)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--mpirun", default=MPIRUN)
    a = ap.parse_args()
    med = {10: [], 0: []}
    boundary, other = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.pairs):
            for every in (10, 0):
                p = run(a, os.path.join(tmp, "r%d_%d.h5" % (i, every)), every)
                kept = {s: v for s, v in p.items() if s >= 2}
                med[every].append(statistics.median(kept.values()))
                print("pair %d rank_stats_every=%2d: median step period %.4f s" % (i, every, med[every][-1]),
                      flush=True)
                if every == 10:
                    # the period of step s holds what follows step s: step s takes in
                    # the window that ended at s-1 when s % 10 == 0
                    boundary += [v for s, v in kept.items() if s % 10 == 0]
                    other += [v for s, v in kept.items() if s % 10 != 0]
    on, off = statistics.median(med[10]), statistics.median(med[0])
    print("\nrank_stats_every  median step period (s)  runs")
    print("%16d  %22.4f  %s" % (10, on, " ".join("%.4f" % x for x in med[10])))
    print("%16d  %22.4f  %s" % (0, off, " ".join("%.4f" % x for x in med[0])))
    print("side by side: %+.2f%% of the step (10 against 0)" % (100.0 * (on - off) / off))
    b, o = statistics.median(boundary), statistics.median(other)
    print("within the runs with the table: steps that take a window in %.4f s, the others %.4f s:"
          " %+.3f%% of the step per step" % (b, o, 100.0 * (b - o) / 10 / o))
    return 0


if __name__ == "__main__":
    sys.exit(main())
