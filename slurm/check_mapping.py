#!/usr/bin/env python3
"""Reads the topology of a trident run file and says in plain words whether
the rank mapping is what the job asked for: the node count and ranks per node
of the allocation, pipeline stages on different nodes, every CP group and
every EP group inside one node (DESIGN.md "Mesh"). Used by
check-interactive.sh after its smoke run and by the slurm tests.

    check_mapping.py RUN.h5 [--nodes N] [--ranks-per-node G] [--job-id ID]
                     [--node-names n1,n2]

Exit status: 0 as asked, 1 not as asked, 2 unreadable file.
"""
import argparse
import sys
from collections import defaultdict


def text(v):
    if isinstance(v, bytes):
        return v.split(b"\0", 1)[0].decode()
    if hasattr(v, "item"):
        v = v.item()
        if isinstance(v, bytes):
            return v.split(b"\0", 1)[0].decode()
    return str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_file")
    ap.add_argument("--nodes", type=int, help="nodes the job asked for")
    ap.add_argument("--ranks-per-node", type=int, help="tasks per node the job asked for")
    ap.add_argument("--job-id", help="Slurm job id the run file must record")
    ap.add_argument("--node-names", help="comma-separated node names of the allocation")
    a = ap.parse_args()

    try:
        import h5py
    except ImportError:
        print("cannot check the mapping: h5py is missing; run scripts/install-deps.sh "
              "and use .venv/bin/python3 (or set TRIDENT_PYTHON)")
        return 2
    try:
        f = h5py.File(a.run_file, "r")
    except OSError as e:
        print(f"cannot read the run file {a.run_file}: {e}")
        return 2

    problems, facts = [], []
    with f:
        if "topology" not in f or "ranks" not in f["topology"]:
            print(f"{a.run_file} has no /topology/ranks table: not a trident run file?")
            return 2
        topo = f["topology"]
        rows = topo["ranks"][()]
        names = rows.dtype.names
        need = ("rank", "node", "pp", "dp", "cp", "ep", "hostname")
        missing = [n for n in need if n not in names]
        if missing:
            print(f"/topology/ranks lacks the columns {missing}")
            return 2
        world = len(rows)
        ep_size = int(topo.attrs.get("ep", 1))
        cp_size = int(topo.attrs.get("cp", 1))
        node_of = {int(r["rank"]): int(r["node"]) for r in rows}
        host_of_node = {}
        for r in rows:
            host_of_node.setdefault(int(r["node"]), text(r["hostname"]))
        nodes = sorted(host_of_node)
        per_node = defaultdict(int)
        for r in rows:
            per_node[int(r["node"])] += 1
        hosts = [host_of_node[n] for n in nodes]
        facts.append(f"{world} ranks on {len(nodes)} node(s) ({', '.join(hosts)}), "
                     f"ranks per node {sorted(set(per_node.values()))}")

        attr_nodes = int(topo.attrs.get("nodes", -1))
        if attr_nodes != len(nodes):
            problems.append(f"/topology says nodes={attr_nodes} but the ranks table uses {len(nodes)}")
        if a.nodes is not None and len(nodes) != a.nodes:
            problems.append(f"asked for {a.nodes} nodes, trident saw {len(nodes)}")
        if a.ranks_per_node is not None and set(per_node.values()) != {a.ranks_per_node}:
            problems.append(f"asked for {a.ranks_per_node} ranks per node, trident saw "
                            f"{dict((host_of_node[n], c) for n, c in per_node.items())}")
        if a.node_names is not None:
            want = sorted(x for x in a.node_names.split(",") if x)
            if sorted(hosts) != want:
                problems.append(f"the allocation's nodes are {want}, the run file names {sorted(hosts)}")
        if a.job_id is not None:
            got = text(f.attrs.get("slurm_job_id", ""))
            if got != a.job_id:
                problems.append(f"run file records slurm_job_id '{got}', the job is {a.job_id}")
            else:
                facts.append(f"run file records job id {got}")

        # Pipeline stages: each on its own node(s) when there is more than one node.
        stage_nodes = defaultdict(set)
        for r in rows:
            stage_nodes[int(r["pp"])].add(node_of[int(r["rank"])])
        stages = sorted(stage_nodes)
        facts.append("; ".join(f"stage {s} on {', '.join(host_of_node[n] for n in sorted(stage_nodes[s]))}"
                               for s in stages))
        if len(nodes) > 1 and len(stages) > 1:
            for i, s in enumerate(stages):
                for t in stages[i + 1:]:
                    shared = stage_nodes[s] & stage_nodes[t]
                    if shared:
                        problems.append(f"pipeline stages {s} and {t} share node(s) "
                                        f"{sorted(host_of_node[n] for n in shared)}")

        # CP groups (same pp, dp) and EP groups (contiguous runs of ep ranks of
        # a stage in (dp, cp) order) must each stay inside one node.
        cp_groups = defaultdict(set)
        stage_members = defaultdict(list)
        for r in rows:
            cp_groups[(int(r["pp"]), int(r["dp"]))].add(node_of[int(r["rank"])])
            stage_members[int(r["pp"])].append((int(r["dp"]), int(r["cp"]), int(r["rank"])))
        split_cp = [k for k, v in cp_groups.items() if len(v) > 1]
        if split_cp:
            problems.append(f"{len(split_cp)} CP group(s) span nodes, e.g. pp={split_cp[0][0]} dp={split_cp[0][1]}")
        else:
            facts.append(f"each of the {len(cp_groups)} CP group(s) of {cp_size} rank(s) inside one node")
        split_ep = 0
        n_ep = 0
        for s, members in stage_members.items():
            members.sort()
            for g in range(0, len(members), max(ep_size, 1)):
                n_ep += 1
                if len({node_of[m[2]] for m in members[g:g + ep_size]}) > 1:
                    split_ep += 1
        if split_ep:
            problems.append(f"{split_ep} EP group(s) span nodes")
        else:
            facts.append(f"each of the {n_ep} EP group(s) of {ep_size} rank(s) inside one node")

    for line in facts:
        print(f"  {line}")
    if problems:
        print("NOT AS ASKED: " + "; ".join(problems))
        return 1
    print("OK: the mapping is what the job asked for")
    return 0


if __name__ == "__main__":
    sys.exit(main())
