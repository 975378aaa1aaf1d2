#!/usr/bin/env python3
"""The test suite's time per label against its budget, and the slowest tests.

    scripts/test-times.py BUILD_DIR [--budget FILE] [--junit FILE] [--labels FILE]

Reads the times ctest wrote (`ctest --output-junit`, default
BUILD_DIR/ctest-times.xml) and each test's labels (`ctest --show-only=json-v1`
in BUILD_DIR), and prints, per label, the tests' summed seconds against the
label's budget (default tests/time-budget.txt: `label seconds  why` a line),
then the ten slowest tests. A label over its budget is marked OVER; the
exit status is 1 then (scripts/test.sh prints the table and keeps the
suite's own verdict), 2 for unreadable input.
"""
import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET


def load_budget(path):
    budget = {}
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            text = raw.split("#", 1)[0].strip()
            if not text:
                continue
            parts = text.split(None, 2)
            if len(parts) < 3:
                raise ValueError("%s:%d: want `label seconds  why`" % (path, number))
            budget[parts[0]] = float(parts[1])
    return budget


def test_labels(build, saved=None):
    if saved:
        with open(saved, encoding="utf-8") as f:
            out = f.read()
    else:
        out = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], check=True,
                             capture_output=True, text=True).stdout
    labels = {}
    for t in json.loads(out).get("tests", []):
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labels[t["name"]] = props.get("LABELS", []) or ["(none)"]
    return labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--junit")
    ap.add_argument("--budget")
    ap.add_argument("--labels", help="ctest --show-only=json-v1 output, instead of running ctest")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    junit = args.junit or os.path.join(args.build, "ctest-times.xml")
    budget_path = args.budget or os.path.join(root, "tests", "time-budget.txt")
    try:
        cases = ET.parse(junit).getroot().iter("testcase")
        times = {c.get("name"): float(c.get("time") or 0) for c in cases}
        budget = load_budget(budget_path)
        labels = test_labels(args.build, args.labels)
    except (OSError, ET.ParseError, ValueError, KeyError, subprocess.CalledProcessError) as e:
        print("test-times: %s" % e, file=sys.stderr)
        return 2
    per_label = {}
    for name, seconds in times.items():
        for label in labels.get(name, ["(none)"]):
            n, s = per_label.get(label, (0, 0.0))
            per_label[label] = (n + 1, s + seconds)
    over = []
    print("%-14s %6s %10s %10s" % ("label", "tests", "seconds", "budget"))
    for label in sorted(per_label):
        n, s = per_label[label]
        b = budget.get(label)
        mark = ""
        if b is not None and s > b:
            mark = "  OVER"
            over.append(label)
        print("%-14s %6d %10.1f %10s%s" % (label, n, s, "-" if b is None else "%.0f" % b, mark))
    print("slowest tests:")
    for name, s in sorted(times.items(), key=lambda kv: -kv[1])[:10]:
        print("  %8.1f s  %s" % (s, name))
    if over:
        print("test-times: over budget: %s" % ", ".join(over))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
