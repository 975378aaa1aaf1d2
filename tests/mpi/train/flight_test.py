#!/usr/bin/env python3
"""The flight recorder under a real `trident run` (4 ranks under mpirun;
share/trident/faults.md, "Flight recorder").

  1. Rank 2 stops itself (SIGSTOP) at step 3 with runtime.timeout_s = 5: the
     job ends within its deadline, the other ranks' flight records are on
     disk beside the run file (RUN.flight/rankNNNNN.json), and
     `trident-analyze flight` names rank 2, its host, and the operation the
     others waited in.
  2. SIGUSR2 to every rank mid-run: each writes its records and the run goes
     on to its last step (exit 0). With one rank's file removed, the
     analyzer names it as missing and analyses the rest.
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

from faults_test import CONFIG, TIMEOUT_S, run_until_stop
from mpirun_cli import BIN, MPIRUN, SMALL_MESH, check, verdict

NP = 4
ANALYZE = [sys.executable, "-m", "trident_analyze"]
ENV = dict(os.environ, PYTHONPATH=os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", ""), "share",
                                               "trident", "analysis"))

LONG_CONFIG = SMALL_MESH + """
[train]
steps = 40
warmup_steps = 1

[output]
timeline = false

[topology]
nodes = 1
devices_per_node = 4
nvlink_domain = 4
"""


def analyze(path, *extra):
    p = subprocess.run(ANALYZE + ["flight", path] + list(extra), env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def records(folder):
    return sorted(n for n in os.listdir(folder) if re.match(r"^rank\d{5}\.json$", n)) \
        if os.path.isdir(folder) else []


def stopped_rank_case():
    marker = "flight-stop-%d" % os.getpid()
    rc, out, err, after_stop = run_until_stop(
        ["--output", marker + ".h5", "--set", "output.checkpoint_dir=ck_stop"],
        {"TRIDENT_TEST_RANK": "2", "TRIDENT_TEST_STOP_AT_STEP": "3"}, marker)
    check(rc == 1, "SIGSTOPped rank: exit 1 (rc=%d)" % rc)
    check(after_stop is not None and after_stop < TIMEOUT_S + 8,
          "SIGSTOPped rank: the job ended %s s after a rank stopped (deadline %d s)"
          % ("%.1f" % after_stop if after_stop is not None else "?", TIMEOUT_S))
    folder = marker + ".flight"
    have = records(folder)
    check(all("rank%05d.json" % r in have for r in (0, 1, 3)),
          "SIGSTOPped rank: the other ranks' flight records are on disk: %s" % have)
    rc, text, aerr = analyze(marker + ".h5")
    print(text, aerr, flush=True)
    check(rc == 0, "flight analysis of the stopped job: exit 0 (rc=%d)" % rc)
    rc, js, _ = analyze(folder, "--json")
    res = json.loads(js) if rc == 0 else {}
    d = res.get("diverge") or {}
    # the host as the job's topology names it (on one machine: its name and the virtual node)
    host = "?"
    if have:
        with open(os.path.join(folder, have[0])) as f:
            host = json.load(f)["hosts"][2]
    check(d.get("rank") == 2 and d.get("host") == host and socket.gethostname() in host,
          "the analyzer names rank 2 and its host (%s) as the rank that never posted: %s" % (host, d))
    waiting = {w["rank"]: w["op"] for w in res.get("waiting", [])}
    waited_by = d.get("waited_by", [])
    check(bool(waited_by) and 2 not in waited_by and
          all(waiting.get(w) == d.get("operation") for w in waited_by),
          "the operation named is the one ranks %s waited in: %s" % (waited_by, d.get("operation")))
    # "held up by" when rank 2 was continued by the launcher and wrote its own records
    check(re.search(r"(never posted by|held up by) rank 2 \(host %s" % re.escape(host), text) is not None,
          "the text names the operation and rank 2 with its host")


def rank_pids(marker):
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"trident") and any(marker.encode() in c for c in cmd):
            pids.append(int(pid))
    return pids


def sigusr2_case():
    marker = "flight-usr2-%d" % os.getpid()
    with open("long.toml", "w") as f:
        f.write(LONG_CONFIG)
    p = subprocess.Popen(MPIRUN + ["-np", str(NP), BIN, "run", "long.toml", "--output", marker + ".h5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_lines, signalled = [], []
    for line in p.stdout:  # rank 0 prints a line per step
        out_lines.append(line)
        if not signalled and line.startswith("step") and int(line.split()[1]) >= 3:
            signalled = rank_pids(marker)
            for pid in signalled:
                os.kill(pid, 12)  # SIGUSR2
    p.wait(timeout=300)
    err = p.stderr.read()
    check(len(signalled) == NP, "SIGUSR2 sent to the %d ranks (%d found)" % (NP, len(signalled)))
    last = [l for l in out_lines if l.startswith("step")]
    check(p.returncode == 0 and last and int(last[-1].split()[1]) == 39,
          "SIGUSR2: the run goes on to its last step, exit 0 (rc=%d, last: %s, stderr: %s)"
          % (p.returncode, last[-1].strip() if last else "-", err.strip()[-300:]))
    folder = marker + ".flight"
    deadline = time.time() + 5
    while len(records(folder)) < NP and time.time() < deadline:
        time.sleep(0.1)
    have = records(folder)
    check(len(have) == NP, "SIGUSR2: every rank wrote its records: %s" % have)
    ok = True
    for name in have:
        with open(os.path.join(folder, name)) as f:
            d = json.load(f)
        ok = ok and d["reason"] == "SIGUSR2" and len(d["ops"]) > 0 and d["capacity"] == 256
    check(ok, "SIGUSR2: each file says why it was written and holds operations")
    if have:
        os.remove(os.path.join(folder, have[0]))
        rc, text, aerr = analyze(folder)
        check(rc == 0 and ("rank %d (host" % int(have[0][4:9])) in text and "no file" in text,
              "a missing record: the analyzer names the rank and analyses the rest (rc=%d): %s%s"
              % (rc, text, aerr))


def main():
    with tempfile.TemporaryDirectory(prefix="trident-flight-") as tmp:
        os.chdir(tmp)
        with open("job.toml", "w") as f:
            f.write(CONFIG)
        stopped_rank_case()
        sigusr2_case()
        os.chdir("/")
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
