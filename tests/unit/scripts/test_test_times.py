#!/usr/bin/env python3
"""scripts/test-times.py on made-up ctest output: the sums per label, the
OVER mark and exit 1 past a budget, exit 2 on a budget line without a reason."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "..", "scripts", "test-times.py")
JUNIT = """<?xml version="1.0"?><testsuite>
<testcase name="a" time="3.5"/><testcase name="b" time="1.25"/><testcase name="c" time="10"/>
</testsuite>"""
LABELS = {"tests": [
    {"name": "a", "properties": [{"name": "LABELS", "value": ["mpi", "io"]}]},
    {"name": "b", "properties": [{"name": "LABELS", "value": ["mpi"]}]},
    {"name": "c", "properties": [{"name": "LABELS", "value": ["slurm"]}]}]}
failures = []


def run(budget):
    with tempfile.TemporaryDirectory() as d:
        paths = {}
        for name, text in (("j.xml", JUNIT), ("l.json", json.dumps(LABELS)), ("b.txt", budget)):
            paths[name] = os.path.join(d, name)
            with open(paths[name], "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, SCRIPT, d, "--junit", paths["j.xml"], "--labels",
                            paths["l.json"], "--budget", paths["b.txt"]],
                           capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


rc, out = run("mpi 5  two tests\nslurm 20  one\nio 4  one\n")
lines = {l.split()[0]: l.split() for l in out.splitlines() if l and not l.startswith(" ")}
check(rc == 0, "within budget: exit 0 (%d, %r)" % (rc, out))
check(lines.get("mpi", [])[1:3] == ["2", "4.8"], "mpi: 2 tests, 4.75 s summed (%r)" % out)
check(lines.get("io", [])[1:3] == ["1", "3.5"], "io: 1 test, 3.5 s (%r)" % out)
check("10.0 s  c" in out.splitlines()[out.splitlines().index("slowest tests:") + 1],
      "the slowest test first (%r)" % out)
rc, out = run("mpi 4  two tests\nslurm 20  one\n")
check(rc == 1 and "OVER" in out and "over budget: mpi" in out,
      "4.75 s against 4: OVER, exit 1 (%d, %r)" % (rc, out))
rc, out = run("mpi 4\n")
check(rc == 2 and "want `label seconds  why`" in out, "a budget without a reason: exit 2 (%r)" % out)
if failures:
    sys.exit(1)
print("all checks passed")
