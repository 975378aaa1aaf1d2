#!/usr/bin/env python3
"""`trident topo` under mpirun -np 8 on the quickstart config (2 nodes x 4):
the printed mapping keeps every CP pair inside one node and puts the two
pipeline stages on different nodes; text and JSON agree; bad input exits 2
with one line naming what was wrong."""
import json
import os
import shlex
import subprocess
import sys

BIN = os.environ["TRIDENT_BIN"]
MPIRUN = shlex.split(os.environ["TRIDENT_MPIRUN"])
CONFIG = os.path.join(os.environ["TRIDENT_SOURCE_DIR"], "share/trident/examples/quickstart.toml")

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def topo(*args, np=8, env_extra=None):
    env = dict(os.environ)
    env.pop("TRIDENT_TOPOLOGY", None)
    env.update(env_extra or {})
    cmd = MPIRUN + ["-np", str(np), BIN, "topo", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=100)
    return p.returncode, p.stdout, p.stderr


# --- JSON: the placement rules ---
rc, out, err = topo(CONFIG, "--format", "json")
check(rc == 0, f"topo --format json exit {rc}: {err.strip()}")
doc = json.loads(out)
ranks = doc["ranks"]
check(len(ranks) == 8 and doc["world"] == 8, "8 ranks listed")
check((doc["nodes"], doc["ranks_per_node"], doc["source"]) == (2, 4, "override"),
      f"shape from [topology]: {doc['nodes']}x{doc['ranks_per_node']} {doc['source']}")
check((doc["pp"], doc["dp"], doc["cp"], doc["ep"]) == (2, 2, 2, 2), "mesh pp=2 dp=2 cp=2 ep=2")
by_rank = {r["rank"]: r for r in ranks}
check(sorted(by_rank) == list(range(8)), "every rank once")

# CP pairs: ranks with the same (pp, dp) form one CP ring; it must lie in one node.
cp_rings = {}
for r in ranks:
    cp_rings.setdefault((r["pp"], r["dp"]), []).append(r)
check(len(cp_rings) == 4, f"4 CP rings, got {len(cp_rings)}")
for key, ring in cp_rings.items():
    check(sorted(x["cp"] for x in ring) == [0, 1], f"CP ring {key} has cp 0 and 1")
    check(len({x["node"] for x in ring}) == 1, f"CP ring {key} spans nodes {[x['node'] for x in ring]}")

# Pipeline: the ranks with the same (dp, cp) are the stages; each on its own node,
# and a stage's ranks all on one node.
for dp in range(2):
    for cp in range(2):
        stages = sorted((r for r in ranks if r["dp"] == dp and r["cp"] == cp), key=lambda r: r["pp"])
        check([s["pp"] for s in stages] == [0, 1], f"stages of dp={dp} cp={cp}")
        check(len({s["node"] for s in stages}) == 2, f"stages of dp={dp} cp={cp} share a node")
for pp in range(2):
    check(len({r["node"] for r in ranks if r["pp"] == pp}) == 1, f"stage {pp} on one node")

# EP groups inside a node, and the listed groups match the coordinates.
for g in doc["groups"]["ep"]:
    check(len({by_rank[m]["node"] for m in g}) == 1, f"EP group {g} spans nodes")
for g in doc["groups"]["cp"]:
    check([by_rank[m]["cp"] for m in g] == list(range(len(g))), f"cp group {g} in cp order")
for g in doc["groups"]["pp"]:
    check([by_rank[m]["pp"] for m in g] == list(range(len(g))), f"pp group {g} in stage order")

# --- text: the table says the same ---
rc, text, err = topo(CONFIG)
check(rc == 0, f"topo (text) exit {rc}: {err.strip()}")
header = None
rows = {}
for line in text.splitlines():
    cols = line.split()
    if cols[:2] == ["rank", "logical"]:
        header = cols
    elif header and len(cols) == len(header) and cols[0].isdigit():
        rows[int(cols[0])] = dict(zip(header, cols))
check(header is not None and len(rows) == 8, "text table with 8 rows")
for r, row in rows.items():
    j = by_rank[r]
    for k in ("node", "pp", "dp", "cp", "ep", "ep_group", "device"):
        check(int(row[k]) == j[k], f"text and json disagree on rank {r} {k}")
    check(row["local"] == str(j["local_rank"]), f"local rank of {r}")
check("topology: source=override nodes=2 ranks_per_node=4 nvlink_domain=4" in text, "summary line")
check(text.count("\n") < 40, "rank 0 prints alone (no duplicated output)")

# --- bad input: exit 2, one line naming the culprit ---
rc, out, err = topo(CONFIG, np=8, env_extra={"TRIDENT_TOPOLOGY": "nodes=two"})
lines = [l for l in err.splitlines() if l.startswith("trident: error")]
check(rc == 2, f"malformed TRIDENT_TOPOLOGY exit {rc}")
check(len(lines) == 1 and "TRIDENT_TOPOLOGY" in lines[0], f"one line naming TRIDENT_TOPOLOGY: {lines}")

rc, out, err = topo(CONFIG, "--set", "parallel.pp=1", "--set", "parallel.cp=8", np=8)
lines = [l for l in err.splitlines() if l.startswith("trident: error")]
check(rc == 2, f"cp=8 on NVLink domains of 4: exit {rc}")
check(len(lines) == 1 and "parallel.cp=8" in lines[0] and "NVLink" in lines[0], f"one line naming parallel.cp and the NVLink rule: {lines}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("topo CLI checks passed")
