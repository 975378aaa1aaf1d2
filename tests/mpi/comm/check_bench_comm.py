#!/usr/bin/env python3
"""`trident bench comm` under mpirun: every operation's table has one row per
doubling size with #wrong = 0 (the data is verifiable by construction), the
HDF5 file holds the same tables, --group measures the mesh's groups, and bad
flags exit 2. Tiny sizes and few iterations: this checks behaviour, not speed."""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ["TRIDENT_BIN"]
MPIRUN = shlex.split(os.environ["TRIDENT_MPIRUN"])
CONFIG = os.path.join(os.environ["TRIDENT_SOURCE_DIR"], "share/trident/examples/quickstart.toml")
OPS = ["allreduce", "allgather", "alltoall", "sendrecv"]

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what)


def bench(np, *args):
    env = dict(os.environ)
    env.pop("TRIDENT_TOPOLOGY", None)
    p = subprocess.run(MPIRUN + ["-np", str(np), BIN, "bench", "comm", *args],
                       capture_output=True, text=True, env=env, timeout=100)
    return p.returncode, p.stdout, p.stderr


def tables(out):
    """{title: [row dicts]} from the printed tables."""
    result, title, header = {}, None, None
    for line in out.splitlines():
        if line.startswith("# ") and " on " in line and "iterations" in line:
            title, header = line[2:], None
            result[title] = []
        elif line.startswith("#") and "size_B" in line:
            header = line[1:].split()
        elif header and line.strip() and not line.startswith("#"):
            result[title].append(dict(zip(header, line.split())))
    return result


with tempfile.TemporaryDirectory() as tmp:
    h5 = os.path.join(tmp, "comm.h5")
    rc, out, err = bench(4, "--min-bytes", "64", "--max-bytes", "64K", "--iters", "3",
                         "--warmup", "1", "--output", h5)
    check(rc == 0, f"bench comm -np 4 exit {rc}: {err.strip()[-400:]}")
    t = tables(out)
    check(len(t) == 4, f"four tables (the default --ops), got {list(t)}")
    for op in OPS:
        title = next((k for k in t if k.startswith(op + " on world")), None)
        check(title is not None, f"table for {op}")
        if title is None:
            continue
        rows = t[title]
        sizes = [int(r["size_B"]) for r in rows]
        check(sizes == [64 << i for i in range(11)], f"{op}: sizes 64..64K doubling, got {sizes}")
        check(all(r["#wrong"] == "0" for r in rows), f"{op}: #wrong all 0")
        check(all(float(r["time_us"]) > 0 for r in rows), f"{op}: positive times")
        check(all(int(r["count"]) * 4 == int(r["size_B"]) for r in rows), f"{op}: count = size/4")
    # nccl-tests' two placements: the all-reduce out of place and in place,
    # each checked; the others out of place only (the Communicator's form).
    for title, rows in t.items():
        in_place = title.startswith("allreduce on")
        check(all(("in_place_#wrong" in r) == in_place for r in rows),
              f"{title}: in-place columns {'present' if in_place else 'absent'}")
        if in_place:
            check(all(r["in_place_#wrong"] == "0" and float(r["in_place_time_us"]) > 0
                      for r in rows), "allreduce in place: #wrong 0, positive times")
    check("wrong elements in total: 0 (OK)" in out, "verdict line")
    check(os.path.exists(h5) and not os.path.exists(h5 + ".tmp"), "HDF5 file written")
    h5ls = shutil.which("h5ls")
    check(h5ls is not None, "h5ls (Debian hdf5-tools) is installed")
    if h5ls and os.path.exists(h5):
        listing = subprocess.run([h5ls, "-r", h5], capture_output=True, text=True).stdout
        for op in OPS:
            check(f"/bench/comm_{op}/busbw_GB_per_s Dataset {{11}}" in listing,
                  f"/bench/comm_{op} has 11 rows in the file")

# The rank-ordered sums the trainer's gradients use (not in the default
# set): over 4 ranks, up to several chunks in flight; every element checked.
rc, out, err = bench(4, "--ops", "allreduce_ordered,reduce_scatter_ordered", "--min-bytes", "64",
                     "--max-bytes", "2M", "--iters", "2", "--warmup", "1")
check(rc == 0, f"bench comm ordered ops exit {rc}: {err.strip()[-400:]}")
t = tables(out)
for op in ("allreduce_ordered", "reduce_scatter_ordered"):
    title = next((k for k in t if k.startswith(op + " on world")), None)
    check(title is not None, f"table for {op}")
    if title is None:
        continue
    rows = t[title]
    check([int(r["size_B"]) for r in rows] == [64 << i for i in range(16)],
          f"{op}: sizes 64..2M doubling")
    check(all(r["#wrong"] == "0" for r in rows), f"{op}: #wrong all 0")
    check(all(int(r["count"]) * 4 == int(r["size_B"]) for r in rows), f"{op}: count = size/4")

# The all-reduce over element types and reductions (nccl-tests' -d / -o):
# one table per pair, float sum the plain "allreduce"; every element checked.
rc, out, err = bench(3, "--ops", "allreduce", "--dtypes", "float,double,int32,int64",
                     "--reduce-ops", "sum,max,min", "--min-bytes", "64", "--max-bytes", "4K",
                     "--iters", "2", "--warmup", "0")
check(rc == 0, f"bench comm typed all-reduces exit {rc}: {err.strip()[-400:]}")
t = tables(out)
want = ["allreduce"] + [f"allreduce_{d}_{r}" for d in ("float", "double", "int32", "int64")
                        for r in ("sum", "max", "min") if (d, r) != ("float", "sum")]
check(sorted(k.split(" on ")[0] for k in t) == sorted(want), f"typed tables: {list(t)}")
sizes = {"float": 4, "double": 8, "int32": 4, "int64": 8}
for title, rows in t.items():
    name = title.split(" on ")[0]
    check(len(rows) == 7 and all(r["#wrong"] == "0" for r in rows), f"{name}: 7 rows, #wrong 0")
    width = sizes[name.split("_")[1]] if name != "allreduce" else 4
    check(all(int(r["count"]) * width == int(r["size_B"]) for r in rows),
          f"{name}: count = size/{width}")

# Groups of the quickstart mesh: 4 EP groups of 2 ranks at once.
rc, out, err = bench(8, CONFIG, "--group", "ep", "--ops", "alltoall,allreduce",
                     "--min-bytes", "1K", "--max-bytes", "4K", "--iters", "2", "--warmup", "0")
check(rc == 0, f"bench comm --group ep exit {rc}: {err.strip()[-400:]}")
t = tables(out)
check(sorted(t) == sorted(["alltoall on ep: 4 group(s) of 2 ranks at once, float32, 2 iterations",
                           "allreduce on ep: 4 group(s) of 2 ranks at once, float32, 2 iterations"]),
      f"ep tables: {list(t)}")
for rows in t.values():
    check(len(rows) == 3 and all(r["#wrong"] == "0" for r in rows), "ep rows correct")

# Device buffers: on the emulated device (host code cannot touch its memory;
# a host access ends the process with exit 86) every operation's buffers are
# the device's, moved by MPI through host copies as a GPU's are.
rc, out, err = bench(4, "--set", "runtime.backend=emulated", "--ops",
                     "allreduce,allgather,alltoall,sendrecv,allreduce_ordered,"
                     "reduce_scatter_ordered", "--dtypes", "float,int64", "--reduce-ops", "sum,max",
                     "--min-bytes", "64", "--max-bytes", "64K", "--iters", "2", "--warmup", "1")
check(rc == 0, f"bench comm on the emulated device exit {rc}: {err.strip()[-400:]}")
t = tables(out)
check(len(t) == 9, f"nine tables on the emulated device, got {list(t)}")
for title, rows in t.items():
    check(len(rows) == 11 and all(r["#wrong"] == "0" for r in rows),
          f"emulated {title}: 11 rows, #wrong 0")
    if title.startswith("allreduce"):
        check(all(r.get("in_place_#wrong") == "0" for r in rows), f"emulated {title}: in place")

for bad in (["--ops", "allreduce,reduce_scatter"], ["--min-bytes", "1X"], ["--group", "tp"],
            ["--min-bytes", "1M", "--max-bytes", "1K"], ["--dtypes", "float,half"],
            ["--reduce-ops", "prod"]):
    rc, out, err = bench(2, *bad)
    lines = [l for l in err.splitlines() if l.startswith("trident: error")]
    check(rc == 2 and len(lines) == 1 and bad[0] in lines[0], f"{bad}: exit {rc}, {lines}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("bench comm checks passed")
