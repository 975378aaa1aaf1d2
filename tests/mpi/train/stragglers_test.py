"""The root straggler (issue 46): on the quickstart's 8 ranks (pp=2 cp=2 dp=2
ep=2), rank 3 at half speed (TRIDENT_TEST_SLOW_RANK: each of its compute
phases takes twice as long) is named by rank and host within two windows of
output.rank_stats_every (the default 10), in one warning line and a
`straggler` row of /events, and the ranks that waited on it are not;
trident-analyze stragglers names it too. With no slow rank no straggler
line: the quickstart (part "quiet"), the pipeline schedules afab,
interleaved, zb-h1 and dualpipev on the same mesh (part "schedules"), and
the long-context example scaled to 8 ranks (part "long_context": its pp=4
cp=8 ep=8 mesh of 32 GPUs is pp=2 cp=4 ep=4 here, d_model 64 and 256
tokens; the schedule, vpp=2, the zig-zag layout, the router, moe_every and
the 16 layers are its own). /ranks/steps holds one row per rank and window
(format_version 3), its phases and waits never add up to more than the
step (the overlapped DualPipeV slot counts its span once), and a
format_version 1 file is still analysed. --load N runs N busy processes
beside the runs (for a check by hand on a quiet machine).

Why not a rank stopped and continued from outside (SIGSTOP/SIGCONT): on
this 2-core host the quickstart's ranks compute about 10 ms of a 100-900 ms
step and wait the rest, so a stop lands in a wait and costs the rank's
compute nothing (stopped half of every 20 ms, rank 3 computed 1.0x its
stage's median per step in most windows, and the job's step time did not
change); and where the cores are oversubscribed the scheduler gives a
stopped process its share back when it continues (faults.md)."""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from mpirun_cli import BIN, MPIRUN, check, verdict  # noqa: E402

# The run file version this trident writes (hdf5-layout.md; 3 since 2026-12-05).
RUN_FILE_VERSION = 3

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EVERY = 10  # output.rank_stats_every, its default
STEPS = 20  # two windows: the straggler is named at the second
QUIET_STEPS = 30  # the quickstart with no slow rank: three windows
QUICKSTART = os.path.join(REPO, "share", "trident", "examples", "quickstart.toml")
LONG_CONTEXT = os.path.join(REPO, "share", "trident", "examples", "long-context.toml")
# long-context.toml on 8 CPU ranks: its mesh and sizes scaled down, the rest its own
LONG_CONTEXT_SCALED = ["model.vocab_size=64", "model.d_model=64", "model.n_heads=4",
                       "model.n_kv_heads=1", "model.ffn_hidden=128", "model.n_experts=8",
                       "data.seq_len=256", "parallel.pp=2", "parallel.cp=4", "parallel.ep=4",
                       "runtime.backend=cpu", "runtime.comm=mpi", "output.activation_steps=[0]"]
SLOW = 3    # the rank at half speed


def run(np, config, out, sets, slow_rank=None, timeout=300):
    """trident run under mpirun; with slow_rank, that rank computes at half
    speed (TRIDENT_TEST_SLOW_RANK). Returns (exit code, stdout, stderr)."""
    env = dict(os.environ)
    if slow_rank is not None:
        env.update(TRIDENT_TEST_SLOW_RANK=str(slow_rank), TRIDENT_TEST_SLOW_FACTOR="2")
    # the end's checkpoint beside the run file, in the test's directory
    args = MPIRUN + ["-np", str(np), BIN, "run", config, "--output", out,
                     "--set", "output.checkpoint_dir=%s.ck" % out]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def table(path):
    with h5py.File(path, "r") as f:
        version = int(f.attrs["format_version"])
        rows = f["ranks/steps"][()] if "ranks/steps" in f else None
        hosts = {int(r["rank"]): r["hostname"].decode() for r in f["topology/ranks"][()]}
        ev = [(int(e["step"]), int(e["rank"]), e["detail"].decode()) for e in f["events"][()]
              if e["kind"].decode() == "straggler"]
    return version, rows, hosts, ev


def analyze(path):
    return subprocess.run([sys.executable, "-m", "trident_analyze", "stragglers", path],
                          env=dict(os.environ, PYTHONPATH=os.path.join(REPO, "share", "trident", "analysis")),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def check_table(path, np, steps, what):
    version, rows, hosts, ev = table(path)
    check(version == RUN_FILE_VERSION, "%s: format_version %d (%d)" % (what, RUN_FILE_VERSION, version))
    windows = -(-steps // EVERY)
    check(rows is not None and len(rows) == windows * np,
          "%s: /ranks/steps holds %d windows x %d ranks (%s rows)"
          % (what, windows, np, None if rows is None else len(rows)))
    if rows is not None and len(rows):
        check(all(r["compute_s"][:2].sum() > 0 and r["step_s"] > 0 for r in rows),
              "%s: every row has forward+backward and step seconds" % what)
        check(sorted(set(int(r["step"]) for r in rows)) == list(range(0, steps, EVERY)),
              "%s: windows start every %d steps" % (what, EVERY))
        # compute and waits are disjoint parts of a rank's steps (an
        # overlapped pair's lanes take turns): together at most the steps
        part = max((r["compute_s"][:5].sum() + r["wait_s"].sum()) / r["step_s"] for r in rows)
        check(part <= 1.02, "%s: compute + waits <= the steps' seconds in every row (at most "
              "%.3f of them)" % (what, part))
    return hosts, ev


def slowed(tmp):
    """Rank SLOW at about half speed: named, by rank and host, within two windows."""
    out = os.path.join(tmp, "slow.h5")
    rc, so, se = run(8, QUICKSTART, out, ["train.steps=%d" % STEPS, "output.rank_stats_every=%d" % EVERY],
                     slow_rank=SLOW)
    check(rc == 0, "slowed run exits 0 (%d): %s" % (rc, se[-400:]))
    lines = [l for l in se.splitlines() if "straggler:" in l]
    hosts, ev = check_table(out, 8, STEPS, "slowed run")
    print("\n".join(lines))
    check(len(lines) >= 1 and all(("rank %d (host %s)" % (SLOW, hosts[SLOW])) in l for l in lines),
          "the straggler line names rank %d and its host %s, and no other rank" % (SLOW, hosts[SLOW]))
    check(len(ev) >= 1 and all(r == SLOW for _, r, _ in ev), "/events: straggler rows name rank %d only (%s)" % (SLOW, ev))
    check(len(ev) >= 1 and ev[0][0] <= 2 * EVERY - 1,
          "named within two windows: first event at step %s <= %d" % (ev[0][0] if ev else None, 2 * EVERY - 1))
    a = analyze(out)
    print(a.stdout)
    check(a.returncode == 0 and ("straggler at step %d: rank %d" % (ev[0][0], SLOW) if ev else "?") in a.stdout
          and ("slowest rank %d" % SLOW) in a.stdout
          and ("s per step without rank %d's excess" % SLOW) in a.stdout,
          "trident-analyze stragglers names rank %d (%d): %s" % (SLOW, a.returncode, a.stderr[-300:]))


def quiet_run(tmp, what, config, np, steps, sets):
    """A run with no slow rank: no straggler line, no straggler row."""
    out = os.path.join(tmp, "q_%s.h5" % what)
    rc, so, se = run(np, config, out, ["train.steps=%d" % steps,
                                       "output.rank_stats_every=%d" % EVERY] + sets)
    check(rc == 0, "%s: exit 0 (%d): %s" % (what, rc, se[-400:]))
    lines = [l for l in se.splitlines() if "straggler" in l]
    check(not lines, "%s: no straggler line (%s)" % (what, lines))
    if rc == 0:
        _, ev = check_table(out, np, steps, what)
        check(not ev, "%s: no straggler row in /events (%s)" % (what, ev))
    return out if rc == 0 else None


def quiet(tmp):
    """The quickstart as it is (1f1b) with no slow rank: no straggler line."""
    out = quiet_run(tmp, "quickstart", QUICKSTART, 8, QUIET_STEPS, [])
    if out:
        older(tmp, out)


def schedules(tmp):
    """The other pipeline schedules on the quickstart's mesh, no slow rank:
    no straggler line (the bubbles and the uneven stages are not stragglers)."""
    for sched, extra in (("afab", []), ("interleaved", ["parallel.vpp=2"]), ("zb-h1", []),
                         ("dualpipev", ["parallel.vpp=2"])):
        quiet_run(tmp, sched, QUICKSTART, 8, STEPS, ["parallel.schedule=%s" % sched] + extra)


def long_context(tmp):
    """The long-context example, scaled to 8 ranks, no slow rank: no line."""
    quiet_run(tmp, "long-context", LONG_CONTEXT, 8, STEPS, LONG_CONTEXT_SCALED)


def older(tmp, path):
    """A format_version 1 file (no /ranks/steps) is still read: from /ranks/summary."""
    import shutil
    v1 = os.path.join(tmp, "v1.h5")
    shutil.copy(path, v1)
    with h5py.File(v1, "r+") as f:
        del f["ranks/steps"]
        f.attrs["format_version"] = np.int64(1)
    a = analyze(v1)
    check(a.returncode == 0 and "/ranks/summary" in a.stdout and "rank" in a.stdout,
          "trident-analyze stragglers reads a format_version 1 file (%d): %s%s"
          % (a.returncode, a.stdout[-300:], a.stderr[-300:]))


class Load:
    """n busy processes beside the runs (--load n), ended with the test."""

    def __init__(self, n):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(n)]

    def end(self):
        for p in self.procs:
            p.kill()
            p.wait()


def main():
    args = sys.argv[1:]
    load = Load(int(args[args.index("--load") + 1]) if "--load" in args else 0)
    if "--load" in args:
        del args[args.index("--load"):args.index("--load") + 2]
    parts = {"slowed": slowed, "quiet": quiet, "schedules": schedules,
             "long_context": long_context}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args or ["slowed", "quiet"]:
                parts[name](tmp)
    finally:
        load.end()
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
