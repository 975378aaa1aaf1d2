#!/usr/bin/env python3
"""Chaos soak: the 8-rank quickstart trained through N random faults, resumed
after each, must end exactly where an uninterrupted run ends.

Faults, one per interrupted job, each at a random moment (after 1 to 4
progress lines of the job), of a random kind (each kind once before any
repeats):
  kill      SIGKILL of a random rank
  stop      SIGSTOP of a random rank (the others' deadline, runtime.timeout_s, fires)
  full      the checkpoint directory fills up (a tmpfs; the next checkpoint fails)
  truncate  SIGKILL of a random rank, then the newest checkpoint cut in half
            (the resume must pass over it)
Every other job saves in the background (output.checkpoint_async = true),
so faults also land while a rank's writer thread is writing its shard.
After each fault the job is started again with --resume. The soak checks that
every fault ended the job (all ranks gone) within its deadline with exactly
one line that names its cause (the stopped rank, in trident's line; the
killed rank, in the launcher's; the full disk),
that no resume used a damaged checkpoint, and at the end that the last loss and
every parameter, AdamW moment and router bias equal the uninterrupted run's bit
for bit. It reports faults injected and survived, time to detect (fault to the
job's end; for "full", the failed checkpoint write to the end) and work lost
per fault (steps trained after the last good checkpoint). Old checkpoints
are pruned to the newest three before each job, as a long job's retention
would.

  chaos_soak.py --faults 5 [--seed S] [--load] [--work DIR] [--bin build/trident]

The jobs' deadline (runtime.timeout_s) follows from what their waits
measurably take: the uninterrupted run goes first with a generous deadline
and reports its longest wait ("waits: longest ..."); the faulty jobs get
4 times that, at least 10 s (--timeout-s N fixes it instead). The floor is
for load that comes after the measurement: on 2026-12-04 a healthy job's
wait reached 5 s on a CI machine that two other MPI jobs had joined. A deadline that
fires in a job where no rank was stopped is a false deadline, counted and a
problem. --load runs a CPU hog on every core for the whole soak, the
reference run included, as a loaded CI machine would.

Needs root for the tmpfs of the "full" fault; without it that kind is left
out and the report says so. Exit 0 when every check held.
"""
import argparse
import math
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "analysis"))
from trident_analyze import flight  # noqa: E402
from trident_analyze.runfile import AnalysisError  # noqa: E402

STEP_LINE = re.compile(r"^step +(\d+) \|")
LONGEST_WAIT = re.compile(r"^waits: longest ([0-9.]+) s")
SILENT = re.compile(r"ranks? ([0-9, ]+)(?: and \d+ more)? did not answer")
KILLED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal 9")
CKPT = re.compile(r"^ckpt_step_(\d+)\.")
REFERENCE_TIMEOUT_S = 60  # the uninterrupted run's deadline, before anything is measured
RESUMED = re.compile(r"^resumed from (\S+) at step (\d+)")


def parse_args():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--faults", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--np", type=int, default=8)
    ap.add_argument("--config", default=os.path.join(repo, "share/trident/examples/quickstart.toml"))
    ap.add_argument("--steps", type=int, default=0, help="train.steps (default: 3 per fault + 12)")
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--timeout-s", type=int, default=0,
                    help="runtime.timeout_s of the faulty jobs (default: from the reference run's waits)")
    ap.add_argument("--load", action="store_true", help="a CPU hog on every core for the whole soak")
    ap.add_argument("--bin", default=os.environ.get("TRIDENT_BIN", os.path.join(repo, "build/trident")))
    ap.add_argument("--mpirun", default=os.environ.get(
        "TRIDENT_MPIRUN", "mpirun --allow-run-as-root --oversubscribe --mca pml ucx "
        "--mca pml_ucx_devices any --mca pml_ucx_tls any --mca btl ^vader,openib --bind-to none"))
    ap.add_argument("--work", default="")
    return ap.parse_args()


def job_env():
    """The jobs' environment: UCX without its cma transport unless UCX_TLS is set.

    UCX treats a failed cross-memory-attach copy as fatal: a rank SIGKILLed in
    the middle of a large intra-node transfer makes the peer reading from it
    abort inside UCX (SIGABRT and a backtrace, 'process_vm_readv ... No such
    process'), and mpirun then names that peer instead of the killed rank
    (seen once in CI on 2026-12-04). Over the shared-memory copy transports
    the peer waits instead, and the killed rank's exit or trident's deadline
    ends the job with the rank named (faults.md)."""
    env = dict(os.environ)
    env.setdefault("UCX_TLS", "^cma")
    return env


class Soak:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.steps = a.steps or 3 * a.faults + 12
        self.mpirun = shlex.split(a.mpirun)
        self.problems = []
        self.records = []  # one per fault
        self.segment = 0
        self.timeout_s = a.timeout_s or REFERENCE_TIMEOUT_S
        self.false_deadlines = 0
        self.longest_wait = None

    def problem(self, what):
        print("PROBLEM: " + what, flush=True)
        self.problems.append(what)

    def command(self, out, ckdir, resume):
        background = "true" if self.segment % 2 else "false"  # async saves every other job
        cmd = self.mpirun + ["-np", str(self.a.np), self.a.bin, "run", self.a.config,
                             "--output", out,
                             "--set", "train.steps=%d" % self.steps,
                             "--set", "runtime.timeout_s=%d" % self.timeout_s,
                             "--set", "output.checkpoint_every=%d" % self.a.checkpoint_every,
                             "--set", "output.checkpoint_dir=%s" % ckdir,
                             "--set", "output.checkpoint_async=" + background,
                             "--set", "output.timeline=false"]
        return cmd + (["--resume"] if resume else [])

    def rank_pids(self, launcher):
        """world rank -> pid of the job's trident processes."""
        out = {}
        kids = subprocess.run(["pgrep", "-P", str(launcher.pid)], stdout=subprocess.PIPE,
                              text=True).stdout.split()
        for pid in kids:
            try:
                env = open("/proc/%s/environ" % pid, "rb").read().split(b"\0")
            except OSError:
                continue
            for kv in env:
                if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                    out[int(kv.split(b"=")[1])] = int(pid)
        return out

    def fill(self, ckdir):
        block = b"\0" * (1 << 20)
        with open(os.path.join(ckdir, "filler"), "wb", buffering=0) as f:
            try:
                while True:
                    f.write(block)
            except OSError:
                pass

    def run_job(self, ckdir, kind):
        """One job; injects `kind` (None: no fault). Returns its record."""
        self.segment += 1
        out = "seg%03d.h5" % self.segment
        resume = any(n.endswith(".h5") for n in os.listdir(ckdir))
        p = subprocess.Popen(self.command(out, ckdir, resume), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env=job_env())
        stdout, stderr = [], []  # filled by reader threads while the job runs
        readers = [threading.Thread(target=lambda f=f, into=into: into.extend(iter(f.readline, "")))
                   for f, into in ((p.stdout, stdout), (p.stderr, stderr))]
        for r in readers:
            r.start()
        rec = {"kind": kind, "segment": self.segment, "resumed_at": 0, "last_step": -1,
               "t_fault": None, "rank": None}
        trigger = self.rng.randint(1, 4)
        deadline = time.time() + 120 + self.steps
        while p.poll() is None and time.time() < deadline:
            seen = sum(1 for line in list(stdout) if STEP_LINE.match(line))
            if kind and rec["t_fault"] is None and seen >= trigger:
                self.inject(p, kind, ckdir, rec)
            time.sleep(0.02)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            self.problem("segment %d (%s) did not end within %d s" % (self.segment, kind, 120 + self.steps))
        p.wait()
        rec["t_end"] = time.time()
        for r in readers:
            r.join()
        err = "".join(stderr)
        with open("seg%03d.log" % self.segment, "w") as f:
            f.write("".join(stdout) + "---- stderr\n" + err)
        for line in stdout:
            m = STEP_LINE.match(line)
            if m:
                rec["last_step"] = int(m.group(1))
            m = RESUMED.match(line)
            if m:
                rec["resumed_at"], rec["resumed_from"] = int(m.group(2)), m.group(1)
        stdout = "".join(stdout)
        rec.update(rc=p.returncode, stderr=err, stdout=stdout, out=out)
        self.count_false_deadline(rec)
        return rec

    def inject(self, p, kind, ckdir, rec):
        if kind == "full":
            self.fill(ckdir)
            rec["t_fault"] = time.time()  # once the disk is full
            return
        rec["t_fault"] = time.time()
        pids = self.rank_pids(p)
        if not pids:
            return
        rank = self.rng.choice(sorted(pids))
        rec["rank"] = rank
        os.kill(pids[rank], signal.SIGSTOP if kind == "stop" else signal.SIGKILL)

    def judge(self, rec, ckdir):
        """Checks one faulty job's ending; returns True when a fault happened."""
        kind, err = rec["kind"], rec["stderr"]
        if rec["t_fault"] is None:
            return False  # the job finished before the fault's moment
        if rec["rc"] == 0:
            if kind == "full" and rec["last_step"] == self.steps - 1:
                return False  # no checkpoint came after the disk filled
            self.problem("segment %d: %s fault, yet the job exited 0" % (rec["segment"], kind))
        self.check_cause(rec)
        if kind == "stop":
            self.check_flight(rec)
        if "MPI_ABORT" in err:
            self.problem("segment %d: %s: MPI_Abort banner on stderr" % (rec["segment"], kind))
        # full: from the moment the disk filled; it shows at the next checkpoint
        rec["detect_s"] = rec["t_end"] - rec["t_fault"]
        # stop: the deadline, 2 s of asking which ranks answer, a moment to agree
        limit = {"kill": 10, "truncate": 10, "stop": self.timeout_s + 12, "full": 20}[kind]
        if rec["detect_s"] > limit:
            self.problem("segment %d: %s fault ended the job after %.1f s (limit %d s)"
                         % (rec["segment"], kind, rec["detect_s"], limit))
        if kind == "full":
            os.remove(os.path.join(ckdir, "filler"))
        if kind == "truncate":
            # only where an older checkpoint remains: with none, the honest
            # answer is "no checkpoint loads" (exit 2) and a start from scratch
            ck = self.checkpoints(ckdir)
            if len(ck) >= 2:
                path = os.path.join(ckdir, "ckpt_step_%08d.h5" % ck[-1])
                data = open(path, "rb").read()
                open(path, "wb").write(data[: len(data) // 2])
                rec["truncated"] = path
            else:
                rec["kind"] = "kill"  # what it was, in the report
        return True

    def check_cause(self, rec):
        """Exactly one line names the fault's cause: trident's for a stopped rank
        (among the ranks that did not answer its probe) and for a full disk; the
        launcher's for a killed rank, and then none of trident's (the ranks that
        fail after it are its consequences)."""
        kind, err = rec["kind"], rec["stderr"]
        errors = [l for l in err.splitlines() if l.startswith("trident: error")]
        killed = [int(r) for r in KILLED.findall(err)]
        if kind == "stop":
            named = [int(r) for m in SILENT.findall(errors[0]) for r in m.split(",")] if errors else []
            ok = len(errors) == 1 and rec["rank"] in named
        elif kind == "full":
            ok = len(errors) == 1 and "No space left on device" in errors[0]
        else:  # kill, truncate
            ok = not errors and killed == [rec["rank"]]
        if not ok:
            self.problem("segment %d: %s of rank %s: expected one line naming the cause; trident's "
                         "lines: %s; the launcher's: killed rank(s) %s"
                         % (rec["segment"], kind, rec["rank"], errors, killed))

    def check_flight(self, rec):
        """A stopped rank: the flight records the others wrote beside the run
        file name it as the rank that held up what they waited in."""
        try:
            res = flight.analyse(rec["out"])
        except AnalysisError as e:
            self.problem("segment %d: stop of rank %s: no flight records to analyse: %s"
                         % (rec["segment"], rec["rank"], e))
            return
        d = res["diverge"] or {}
        rec["flight_named"] = d.get("rank")
        if d.get("rank") != rec["rank"]:
            self.problem("segment %d: stop of rank %s: the flight records name rank %s (%s)"
                         % (rec["segment"], rec["rank"], d.get("rank"), flight.format_text(res)))

    def count_false_deadline(self, rec):
        """A deadline that fired where no rank was stopped: a healthy job, slow."""
        if "timed out after" in rec["stderr"] and (rec["kind"] != "stop" or rec["t_fault"] is None):
            self.false_deadlines += 1
            self.problem("segment %d (%s): a deadline fired with no rank stopped (false deadline): %s"
                         % (rec["segment"], rec["kind"], rec["stderr"][-400:]))

    @staticmethod
    def checkpoints(ckdir):
        """Steps of the complete checkpoints in ckdir (an index file each), oldest first."""
        return sorted(int(m.group(1)) for n in os.listdir(ckdir)
                      for m in [CKPT.match(n)] if m and n == "ckpt_step_%s.h5" % m.group(1))

    def prune(self, ckdir, keep=3):
        """Keeps the newest checkpoints only (an index and its shards, or one file),
        as a long job's retention would; temporary files and the shards of
        saves that did not complete go too."""
        kept = set(self.checkpoints(ckdir)[-keep:])
        for n in os.listdir(ckdir):
            m = CKPT.match(n)
            if m and (int(m.group(1)) not in kept or ".tmp" in n):
                os.remove(os.path.join(ckdir, n))

    def soak(self, ckdir, kinds):
        # every kind once (in a random order) before any repeats
        plan = self.rng.sample(kinds, len(kinds))
        if plan[0] == "truncate":  # the first job has no older checkpoint to fall back on
            plan.append(plan.pop(0))
        plan += [self.rng.choice(kinds) for _ in range(max(0, self.a.faults - len(plan)))]
        done = 0
        while True:
            self.prune(ckdir)
            kind = plan[done] if done < self.a.faults else None
            rec = self.run_job(ckdir, kind)
            if self.records and "next_resume_checked" not in self.records[-1]:
                self.check_resume(self.records[-1], rec)
            if kind is None:
                if rec["rc"] != 0:
                    self.problem("the final job failed (rc=%d): %s" % (rec["rc"], rec["stderr"][-400:]))
                return rec
            if rec["t_fault"] is None and rec["rc"] != 0:
                self.problem("segment %d failed with no fault injected (rc=%d): %s"
                             % (rec["segment"], rec["rc"], rec["stderr"][-400:]))
                return rec
            if self.judge(rec, ckdir):
                done += 1
                self.records.append(rec)
                print("fault %d/%d: %-8s rank %s at step %d, ended in %.1f s"
                      % (done, self.a.faults, kind, rec["rank"], rec["last_step"], rec["detect_s"]),
                      flush=True)
            elif rec["rc"] == 0 and rec["last_step"] == self.steps - 1:
                self.problem("the run finished before all faults were injected: raise --steps")
                return rec

    def check_resume(self, prev, rec):
        prev["next_resume_checked"] = True
        prev["resumed_at_next"] = rec["resumed_at"]
        prev["lost"] = max(0, prev["last_step"] + 1 - rec["resumed_at"])
        bad = prev.get("truncated")
        if bad and rec.get("resumed_from", "").endswith(os.path.basename(bad)):
            self.problem("segment %d resumed from the truncated %s" % (rec["segment"], bad))
        if bad and os.path.basename(bad) not in rec["stderr"]:
            self.problem("segment %d did not name the truncated checkpoint it passed over"
                         % rec["segment"])

    def tensors(self, path):
        out = {}
        with h5py.File(path, "r") as f:
            f["tensors"].visititems(lambda n, o: out.__setitem__(n, o[()])
                                    if isinstance(o, h5py.Dataset) else None)
        return out

    def final_loss(self, run_file):
        with h5py.File(run_file, "r") as f:
            rows = f["metrics/steps"][()]
        return {int(s): float(l) for s, l in zip(rows["step"], rows["loss"])}.get(self.steps - 1)


def mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode == 0, p.stdout.strip()


def report(s, t0):
    recs = [r for r in s.records if "detect_s" in r]
    by_kind = {}
    for r in recs:
        by_kind[r["kind"]] = by_kind.get(r["kind"], 0) + 1
    detect = [r["detect_s"] for r in recs]
    lost = [r.get("lost", 0) for r in recs]
    survived = sum(1 for r in recs if "lost" in r)
    print("\nchaos soak: %d faults injected (%s), %d survived (resumed), %d jobs, %.0f s"
          % (len(recs), ", ".join("%s %d" % kv for kv in sorted(by_kind.items())), survived,
             s.segment, time.time() - t0))
    if detect:
        print("time to detect: max %.1f s, median %.1f s (stop: deadline runtime.timeout_s = %d s)"
              % (max(detect), statistics.median(detect), s.timeout_s))
        for k in sorted(by_kind):
            d = [r["detect_s"] for r in recs if r["kind"] == k]
            print("  %-8s max %.1f s, median %.1f s" % (k, max(d), statistics.median(d)))
    print("false deadlines (a deadline that fired with no rank stopped): %d" % s.false_deadlines)
    stops = [r for r in recs if r["kind"] == "stop"]
    if stops:
        print("flight records: %d of %d stopped ranks named (%s)"
              % (sum(1 for r in stops if r.get("flight_named") == r["rank"]), len(stops),
                 ", ".join("rank %s: named %s" % (r["rank"], r.get("flight_named")) for r in stops)))
    if lost:
        print("work lost per fault: mean %.2f steps, max %d steps (checkpoint every %d steps)"
              % (statistics.mean(lost), max(lost), s.a.checkpoint_every))


class Hog:
    """One busy process per core (--load), ended by its pids when the soak ends."""

    def __init__(self, on):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(os.cpu_count() or 1)] if on else []

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()


def measured_deadline(s, ref):
    """runtime.timeout_s of the faulty jobs: 4 times the uninterrupted run's
    longest wait (any rank, start-up and checkpoints included), at least 10 s."""
    m = [LONGEST_WAIT.match(l) for l in ref["stdout"].splitlines()]
    longest = max([float(x.group(1)) for x in m if x] or [0.0])
    if not s.a.timeout_s:
        s.timeout_s = max(10, math.ceil(4 * longest))
    print("uninterrupted run: longest wait %.2f s (deadline %d s); the faulty jobs' deadline: %d s%s"
          % (longest, REFERENCE_TIMEOUT_S if not s.a.timeout_s else s.a.timeout_s, s.timeout_s,
             " (--timeout-s)" if s.a.timeout_s else " (4 x the longest wait, at least 10 s)"),
          flush=True)
    return longest


def check_end_state(s, ref, last):
    """The last loss and every tensor of the final checkpoint equal the
    uninterrupted run's bit for bit."""
    got, want = s.final_loss(last["out"]), s.final_loss(ref["out"])
    if got is None or got != want:
        s.problem("final loss %r differs from the uninterrupted run's %r" % (got, want))
    ref_t = s.tensors("ck_ref/ckpt_step_%08d.h5" % s.steps)
    final = "ck/ckpt_step_%08d.h5" % s.steps
    got_t = s.tensors(final) if os.path.exists(final) else {}
    same = ref_t.keys() == got_t.keys() and all(np.array_equal(ref_t[k], got_t[k]) for k in ref_t)
    if not same:
        s.problem("final parameters or optimizer state differ from the uninterrupted run's")
    else:
        print("final state: loss %r and %d tensors equal the uninterrupted run's bit for bit"
              % (got, len(ref_t)))


def main():
    a = parse_args()
    t0 = time.time()
    work = a.work or tempfile.mkdtemp(prefix="trident-soak-")
    os.makedirs(work, exist_ok=True)
    os.chdir(work)
    s = Soak(a)
    print("chaos soak in %s: %d faults, %d steps, seed %d%s" % (
        work, a.faults, s.steps, a.seed, ", a CPU hog on each of %d cores" % os.cpu_count()
        if a.load else ""), flush=True)
    hog = Hog(a.load)
    mounted = False
    try:
        os.makedirs("ck_ref", exist_ok=True)
        ref = s.run_job("ck_ref", None)
        if ref["rc"] != 0:
            print("the uninterrupted run failed: " + ref["stderr"][-400:])
            return 1
        s.longest_wait = measured_deadline(s, ref)
        kinds = ["kill", "stop", "full", "truncate"]
        # room for every checkpoint of the last job (a few MB each)
        mounted, why = mount_tmpfs("ck", "%dm" % max(256, 8 * (s.steps // a.checkpoint_every + 10)))
        if not mounted:
            kinds.remove("full")
            print("note: no tmpfs for the checkpoint directory (%s): the 'full' fault is left out" % why)
        last = s.soak("ck", kinds)
        check_end_state(s, ref, last)  # whatever happened on the way
    finally:
        hog.stop()
        if mounted:
            subprocess.run(["umount", "ck"], stderr=subprocess.DEVNULL)
    report(s, t0)
    if s.problems:
        print("%d problem(s)" % len(s.problems))
        return 1
    print("all checks held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
