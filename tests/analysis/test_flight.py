"""trident-analyze flight on hand-made flight records (the layout of
share/trident/hdf5-layout.md, "Flight records"): the rank that never posted
a collective, the end of a chain of point-to-point waits, a rank's records
written after the first deadline read as of it, a cycle named a deadlock,
missing and unreadable files named and the rest analysed."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.environ.get("TRIDENT_SOURCE_DIR", ""), "share", "trident", "analysis"))
from trident_analyze import cli, flight  # noqa: E402
from trident_analyze.runfile import AnalysisError  # noqa: E402

HOSTS = ["n0", "n0", "n1", "n1"]
WORLD = {"kind": "world", "name": "world", "rank": 0, "members": [0, 1, 2, 3]}


def op(i, kind, seq, posted, waiting=None, completed=None, peer=-1, tag=0, group=0, nbytes=8):
    state = "completed" if completed is not None else ("waiting" if waiting is not None else "posted")
    return {"id": i, "kind": kind, "group": group, "seq": seq, "peer": peer, "tag": tag, "bytes": nbytes,
            "state": state, "posted": posted, "waiting": waiting, "completed": completed}


def write(folder, rank, ops, written_at=100.0, groups=(WORLD,), reason="timeout", was_stopped=False):
    os.makedirs(folder, exist_ok=True)
    d = {"format": "trident-flight", "version": 1, "rank": rank, "world_size": 4, "host": HOSTS[rank],
         "pid": 1, "reason": reason, "was_stopped": was_stopped, "written_at": written_at, "capacity": 256, "recorded": len(ops),
         "hosts": HOSTS, "groups": [dict(g, rank=g["members"].index(rank)) for g in groups], "ops": ops}
    with open(os.path.join(folder, "rank%05d.json" % rank), "w") as f:
        json.dump(d, f)


def done_ops(n):
    return [op(i + 1, "allreduce", i, 1.0 + i, 1.0 + i, 1.1 + i) for i in range(n)]


def test_the_rank_that_never_posted_a_collective_is_named_with_its_host(tmp_path):
    d = str(tmp_path / "run.flight")
    for r in (0, 1, 3):
        write(d, r, done_ops(5) + [op(6, "allreduce", 5, 50.0, 50.0)], written_at=90.0 + r)
    # rank 2: no file (stopped, then killed)
    res = flight.analyse(str(tmp_path / "run.h5"))  # the run file's name finds RUN.flight
    assert res["missing"] == [{"rank": 2, "host": "n1", "why": "no file"}]
    assert res["diverge"]["rank"] == 2 and res["diverge"]["host"] == "n1"
    assert res["diverge"]["waited_by"] == [0, 1, 3]
    assert "allreduce #5" in res["diverge"]["operation"]
    assert [w["waits_for"] for w in res["waiting"]] == [[2], [2], [2]]
    text = flight.format_text(res)
    assert "never posted by rank 2 (host n1" in text and "rank 2 (host n1): no file" in text


def test_a_chain_of_receives_ends_at_the_rank_that_computes(tmp_path):
    d = str(tmp_path / "f")
    group = {"kind": "pp", "name": "pp", "rank": 0, "members": [0, 1, 2, 3]}
    write(d, 0, [op(1, "recv", 0, 10.0, 10.0, peer=1, tag=3, nbytes=64)], groups=(group,))
    write(d, 1, [op(1, "recv", 0, 10.0, 10.0, peer=2, tag=3, nbytes=64)], groups=(group,))
    write(d, 2, [op(1, "send", 0, 9.0, 9.0, 9.5, peer=3, tag=3)], groups=(group,))  # all done: computing
    with open(os.path.join(d, "rank00003.json"), "w") as f:
        f.write("{ truncated")
    res = flight.analyse(d)
    assert res["missing"][0]["rank"] == 3 and res["missing"][0]["why"].startswith("unreadable")
    assert res["diverge"]["rank"] == 2 and res["diverge"]["waited_by"] == [1]
    assert "recv of 64 B from rank 2 (tag 3)" in res["diverge"]["operation"]
    assert "not blocked" in res["diverge"]["note"]
    assert res["deadlock"] == []


def test_records_written_after_the_first_deadline_are_read_as_of_it(tmp_path):
    d = str(tmp_path / "f")
    for r in (0, 1, 3):
        write(d, r, done_ops(3) + [op(4, "allreduce", 3, 20.0, 20.0)], written_at=30.0)
    # rank 2 was stopped, continued by the launcher at 40 s: it posted #3 then
    write(d, 2, done_ops(3) + [op(4, "allreduce", 3, 40.0, 40.0)], written_at=41.0)
    res = flight.analyse(d)
    assert res["missing"] == []
    assert res["diverge"]["rank"] == 2 and "allreduce #3" in res["diverge"]["operation"]
    assert res["as_of"] == 30.0


def test_a_rank_stopped_inside_a_wait_and_continued_is_the_cause(tmp_path):
    d = str(tmp_path / "f")
    group = {"kind": "pp", "name": "pp", "rank": 0, "members": [0, 1, 2, 3]}
    # rank 1 stopped while waiting for rank 0's message, which had arrived; rank 0 waits for its reply
    write(d, 0, [op(1, "recv", 0, 10.0, 10.0, peer=1, tag=2)], written_at=25.0, groups=(group,))
    write(d, 1, [op(1, "recv", 0, 9.0, 9.0, 40.0, peer=0, tag=1)], written_at=41.0, groups=(group,),
          reason="rank 0 failed (exit 1)", was_stopped=True)
    write(d, 2, [op(1, "recv", 0, 10.0, 10.0, peer=1, tag=2)], written_at=26.0, groups=(group,))
    write(d, 3, [op(1, "recv", 0, 10.0, 10.0, peer=2, tag=2)], written_at=26.0, groups=(group,))
    res = flight.analyse(d)
    assert res["deadlock"] == []
    assert res["diverge"]["rank"] == 1 and res["diverge"]["waited_by"] == [0, 2]
    assert "stopped and continued" in res["diverge"]["note"]
    assert [e["rank"] for e in res["never_posted"]] == [1]


def test_a_rank_stopped_inside_a_collective_it_posted_is_the_cause(tmp_path):
    d = str(tmp_path / "f")
    for r in (0, 2, 3):
        write(d, r, done_ops(2) + [op(3, "allreduce", 2, 20.0, 20.0)], written_at=30.0 + r)
    write(d, 1, done_ops(2) + [op(3, "allreduce", 2, 19.0, 19.0, 45.0)], written_at=46.0, was_stopped=True)
    res = flight.analyse(d)
    assert res["diverge"]["rank"] == 1 and res["diverge"]["waited_by"] == [0, 2, 3]


def test_a_cycle_of_waits_is_a_deadlock(tmp_path):
    d = str(tmp_path / "f")
    for r, peer in ((0, 1), (1, 0), (2, 3), (3, 2)):
        write(d, r, [op(1, "recv", 0, 5.0, 5.0, peer=peer, tag=1)])
    res = flight.analyse(d)
    assert res["deadlock"] == [0, 1, 2, 3] or res["deadlock"] in ([0, 1], [2, 3])
    assert "deadlock" in flight.format_text(res)


def test_no_hang_no_culprit(tmp_path):
    d = str(tmp_path / "f")
    for r in range(4):
        write(d, r, done_ops(4), reason="SIGUSR2")
    res = flight.analyse(d)
    assert res["diverge"] is None and res["waiting"] == []
    assert "no rank was blocked" in flight.format_text(res)


def test_nothing_readable_is_one_line_and_exit_2(tmp_path, capsys):
    d = tmp_path / "f"
    d.mkdir()
    (d / "rank00000.json").write_text("not json")
    with pytest.raises(AnalysisError):
        flight.analyse(str(d))
    assert cli.main(["flight", str(d)]) == 2
    assert cli.main(["flight", str(tmp_path / "nothing.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("trident-analyze: error:") for e in err)
