"""`trident-analyze flight PATH`: where a job stopped, and who never arrived.

Reads the flight records every rank wrote (RUN.flight/rankNNNNN.json; the
layout is in share/trident/hdf5-layout.md, "Flight records") and works out,
as of the earliest file's writing (the first deadline, usually):

- what each rank was blocked in: its operation with a wait started and not
  completed;
- whom it waited for: a point-to-point operation's peer; a collective's
  members that had not posted it (their records end before it, or they
  have no records);
- the first operation at which the ranks diverge, and the rank(s) that never
  posted it, with their hosts: the ranks the waits lead to that are not
  themselves blocked (no records: stopped or dead; records that say the
  process was stopped and continued; or not in a wait: still computing). A cycle of ranks
  waiting on each other is a deadlock and is named as one.

A rank whose file is missing or unreadable is named and the rest analysed.
"""
from __future__ import annotations

import json
import os
import re

from .runfile import AnalysisError

P2P = ("send", "recv")
FILE_RE = re.compile(r"^rank(\d+)\.json$")


def flight_dir(path: str) -> str:
    """The records' folder: PATH itself, or the run file's RUN.flight."""
    if os.path.isdir(path):
        return path
    base = path[:-3] if path.endswith(".h5") else path
    if os.path.isdir(base + ".flight"):
        return base + ".flight"
    raise AnalysisError(f"{path}: no flight records (neither a folder nor a run file with {base}.flight beside it)")


def read_records(folder: str) -> tuple[dict, dict]:
    """({rank: parsed file}, {rank: why it could not be read})."""
    files, bad = {}, {}
    for name in sorted(os.listdir(folder)):
        m = FILE_RE.match(name)
        if not m:
            continue
        rank = int(m.group(1))
        try:
            with open(os.path.join(folder, name)) as f:
                d = json.load(f)
            if d.get("format") != "trident-flight" or int(d["rank"]) != rank:
                raise ValueError("not a trident flight record of this rank")
            if int(d["version"]) != 1:
                raise ValueError(f"version {d['version']} (this analyzer reads version 1)")
            files[rank] = d
        except (OSError, ValueError, KeyError, TypeError) as e:
            bad[rank] = f"unreadable ({e})"
    if not files:
        raise AnalysisError(f"{folder}: no readable flight record (rankNNNNN.json)")
    return files, bad


def _group_keys(d: dict) -> list:
    """Each group of a file as a key equal on every member: kind, name,
    members, and how many such groups this rank made before it."""
    seen: dict = {}
    keys = []
    for g in d["groups"]:
        base = (g["kind"], g["name"], tuple(g["members"]))
        keys.append(base + (seen.get(base, 0),))
        seen[base] = seen.get(base, 0) + 1
    return keys


def _as_of(op: dict, t_ref: float) -> dict | None:
    """op as it stood at t_ref (None: not yet posted)."""
    if op["posted"] is None or op["posted"] > t_ref:
        return None
    done = op["completed"] is not None and op["completed"] <= t_ref
    return dict(op, done=done)


class Rank:
    """One rank's records as of the reference time."""

    def __init__(self, d: dict, t_ref: float):
        self.rank = int(d["rank"])
        self.host = d.get("host", "")
        self.reason = d.get("reason", "")
        # stopped and continued (SIGSTOP, then the launcher's SIGCONT): the cause, whatever its
        # records say it was waiting in when it stopped
        self.was_stopped = bool(d.get("was_stopped", False))
        self.keys = _group_keys(d)
        self.ops = [o for o in (_as_of(op, t_ref) for op in d["ops"]) if o]
        for o in self.ops:
            o["gkey"] = self.keys[o["group"]] if 0 <= o["group"] < len(self.keys) else None
        # the newest collective posted per group: its seq
        self.last_seq: dict = {}
        for o in self.ops:
            if o["kind"] not in P2P and o["gkey"] is not None:
                self.last_seq[o["gkey"]] = max(self.last_seq.get(o["gkey"], -1), o["seq"])
        waiting = [o for o in self.ops if not o["done"] and o["waiting"] is not None]
        self.blocked = max(waiting, key=lambda o: o["waiting"]) if waiting else None


def describe(op: dict, ranks_in: str = "") -> str:
    kind, name = (op["gkey"][0], op["gkey"][1]) if op["gkey"] else ("?", "group %d" % op["group"])
    if op["kind"] in P2P:
        way = "to" if op["kind"] == "send" else "from"
        return f"{op['kind']} of {op['bytes']} B {way} rank {op['peer']} (tag {op['tag']}) on {name} ({kind})"
    root = f" rooted at rank {op['peer']}" if op["peer"] >= 0 else ""
    return f"{op['kind']} #{op['seq']} of {op['bytes']} B{root} on {name} ({kind}{ranks_in})"


def _waits_for(r: Rank, ranks: dict) -> list:
    """The world ranks r's blocked operation waits for."""
    op = r.blocked
    if op is None or op["gkey"] is None or r.was_stopped:
        return []
    if op["kind"] in P2P:
        return [op["peer"]]
    out = []
    for m in op["gkey"][2]:
        if m == r.rank:
            continue
        other = ranks.get(m)
        # no records, records that end before it, or stopped inside it
        if other is None or other.was_stopped or other.last_seq.get(op["gkey"], -1) < op["seq"]:
            out.append(m)
    return out


def _roots(start: int, edges: dict, ranks: dict) -> tuple[set, list]:
    """The ranks the waits from start lead to that wait for nobody, and a
    cycle of blocked ranks met on the way (a deadlock), if any."""
    roots, cycle = set(), []
    path: list = []

    def walk(r):
        if r in path:
            cycle.extend(path[path.index(r):])
            return
        nxt = edges.get(r, [])
        if r not in ranks or not nxt:
            roots.add(r)
            return
        path.append(r)
        for n in nxt:
            walk(n)
        path.pop()

    walk(start)
    roots.discard(start)
    return roots, cycle


def analyse(path: str) -> dict:
    folder = flight_dir(path)
    files, bad = read_records(folder)
    any_file = next(iter(files.values()))
    world = int(any_file["world_size"])
    hosts = any_file.get("hosts", [])
    missing = {r: "no file" for r in range(world) if r not in files and r not in bad}
    missing.update(bad)
    first = min(files.values(), key=lambda d: d["written_at"])
    t_ref = float(first["written_at"])
    ranks = {r: Rank(d, t_ref) for r, d in files.items()}
    edges = {r: _waits_for(x, ranks) for r, x in ranks.items()}
    waiting, culprits, deadlock = [], {}, []
    for r, x in sorted(ranks.items()):
        if x.blocked is None:
            continue
        op = x.blocked
        waiting.append({"rank": r, "host": x.host, "op": describe(op), "posted": op["posted"],
                        "waiting_s": max(0.0, t_ref - op["waiting"]), "waits_for": edges[r],
                        # as it stood then: a wait that passed its deadline, or one going on
                        "state": "timed_out" if op["state"] == "timed_out" else "waiting"})
        roots, cycle = _roots(r, edges, ranks)
        if cycle and not deadlock:
            deadlock = sorted(set(cycle))
        for root in roots:
            if root in edges.get(r, []):
                culprits.setdefault(root, []).append((op["posted"], r, op))
            else:
                culprits.setdefault(root, [])
    return _result(folder, world, hosts, files, missing, first, t_ref, ranks, waiting,
                   culprits, deadlock)


def _result(folder, world, hosts, files, missing, first, t_ref, ranks, waiting, culprits,
            deadlock) -> dict:
    def host_of(r):
        return hosts[r] if 0 <= r < len(hosts) else ""

    never = []
    for root, direct in sorted(culprits.items()):
        if root not in ranks:
            why = missing.get(root, "no file")
        elif ranks[root].was_stopped:
            why = "present; this rank was stopped and continued (SIGSTOP, SIGCONT)"
        elif ranks[root].blocked is None:
            why = "present; not blocked in any wait (computing, or left)"
        else:
            why = "present; blocked in " + describe(ranks[root].blocked) + ", which all its ranks posted"
        entry = {"rank": root, "host": host_of(root), "note": why,
                 "was_stopped": root in ranks and ranks[root].was_stopped}
        if direct:
            posted, by, op = min(direct, key=lambda t: t[0])
            entry["operation"] = describe(op)
            # the ranks in that operation; the others waited on the same rank in operations of their own
            entry["waited_by"] = sorted({w for _, w, o in direct if describe(o) == entry["operation"]})
            entry["also_waited_by"] = sorted({w for _, w, _ in direct} - set(entry["waited_by"]))
            entry["first_posted"] = posted
        never.append(entry)
    never.sort(key=lambda e: e.get("first_posted", float("inf")))
    diverge = never[0] if never and "operation" in never[0] else None
    return {"folder": folder, "world_size": world, "ranks_read": sorted(files),
            "missing": [{"rank": r, "host": host_of(r), "why": w} for r, w in sorted(missing.items())],
            "as_of": t_ref, "as_of_rank": int(first["rank"]), "as_of_reason": first.get("reason", ""),
            "waiting": waiting, "never_posted": never, "diverge": diverge, "deadlock": deadlock}


def format_text(res: dict) -> str:
    lines = [f"flight records: {len(res['ranks_read'])} of {res['world_size']} ranks in {res['folder']} "
             "(ranks are world ranks)"]
    for m in res["missing"]:
        lines.append(f"  rank {m['rank']} (host {m['host'] or '?'}): {m['why']}; analysed without it")
    lines.append(f"as of {res['as_of']:.3f} s on the job's clock, when rank {res['as_of_rank']} wrote "
                 f"its records ({res['as_of_reason']})")
    d = res["diverge"]
    if d:
        who = "held up by rank" if d["was_stopped"] else "never posted by rank"
        lines.append(f"ranks diverge at: {d['operation']}: rank(s) "
                     f"{', '.join(map(str, d['waited_by']))} waited in it; {who} "
                     f"{d['rank']} (host {d['host'] or '?'}; its records: {d['note']})")
        if d["also_waited_by"]:
            lines.append(f"  rank(s) {', '.join(map(str, d['also_waited_by']))} waited on rank {d['rank']} "
                         "in operations of their own (below)")
    for e in res["never_posted"][1 if d else 0:]:
        what = f" the operation {e['operation']}" if "operation" in e else " what the others waited for"
        lines.append(f"also never posted{what}: rank {e['rank']} (host {e['host'] or '?'}; {e['note']})")
    if res["deadlock"]:
        lines.append("deadlock: ranks " + ", ".join(map(str, res["deadlock"])) +
                     " each wait for another of them")
    if not res["waiting"]:
        lines.append("no rank was blocked in a wait: the records show no hang")
    for w in res["waiting"]:
        lines.append(f"  rank {w['rank']} ({w['host']}): {w['state']} {w['waiting_s']:.1f} s in "
                     f"{w['op']}, for rank(s) {', '.join(map(str, w['waits_for'])) or '-'}")
    return "\n".join(lines)
