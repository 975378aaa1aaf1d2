"""slurm/check_mapping.py must tell a right mapping from each kind of wrong
one: it is what the slurm tests and check-interactive.sh trust. Builds small
run files with the /topology layout of DESIGN.md and checks the verdicts."""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

CHECK = os.path.join(os.environ["TRIDENT_SOURCE_DIR"], "slurm", "check_mapping.py")
ROW = np.dtype([("rank", "<i4"), ("node", "<i4"), ("local_rank", "<i4"), ("device", "<i4"),
                ("pp", "<i4"), ("dp", "<i4"), ("cp", "<i4"), ("ep", "<i4"), ("hostname", "S64")])


def run_file(path, node_of_rank, pp, dp, cp, ep, job="42", hosts=("n1", "n2")):
    """Ranks in mesh order (cp fastest, then dp, then pp), placed on nodes by node_of_rank."""
    world = pp * dp * cp
    rows = np.zeros(world, dtype=ROW)
    local = {}
    for r in range(world):
        node = node_of_rank(r)
        rows[r] = (r, node, local.setdefault(node, 0), -1, r // (cp * dp), (r // cp) % dp, r % cp,
                   ((r // cp) % dp * cp + r % cp) % ep, hosts[node].encode())
        local[node] += 1
    with h5py.File(path, "w") as f:
        f.attrs["slurm_job_id"] = job
        t = f.create_group("topology")
        for k, v in dict(nodes=len(set(map(node_of_rank, range(world)))), ranks_per_node=world // 2,
                         nvlink_domain=world // 2, pp=pp, dp=dp, cp=cp, ep=ep, vpp=1).items():
            t.attrs[k] = v
        t.attrs["source"] = "detected"
        t.create_dataset("ranks", data=rows)


def verdict(path, *extra):
    p = subprocess.run([sys.executable, CHECK, path, "--nodes", "2", "--ranks-per-node", "4",
                        "--node-names", "n1,n2", *extra], capture_output=True, text=True)
    return p.returncode, p.stdout


def main():
    failures = []
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "run.h5")

        run_file(f, lambda r: r // 4, pp=2, dp=2, cp=2, ep=2)
        rc, out = verdict(f, "--job-id", "42")
        if rc != 0 or "OK:" not in out:
            failures.append(f"right mapping not accepted: {rc} {out}")

        rc, out = verdict(f, "--job-id", "43")
        if rc != 1 or "slurm_job_id" not in out:
            failures.append(f"wrong job id not caught: {rc} {out}")

        # Stages interleaved over the nodes: rank r on node (r // 2) % 2 puts
        # both stages on both nodes, while CP pairs stay inside one node.
        run_file(f, lambda r: (r // 2) % 2, pp=2, dp=2, cp=2, ep=2)
        rc, out = verdict(f)
        if rc != 1 or "pipeline stages 0 and 1 share" not in out:
            failures.append(f"stages sharing nodes not caught: {rc} {out}")

        # CP pairs split across nodes: rank r on node r % 2.
        run_file(f, lambda r: r % 2, pp=2, dp=2, cp=2, ep=2)
        rc, out = verdict(f)
        if rc != 1 or "CP group(s) span nodes" not in out:
            failures.append(f"CP group across nodes not caught: {rc} {out}")

        # One stage over both nodes with ep=8: its one EP group spans them.
        run_file(f, lambda r: r // 4, pp=1, dp=4, cp=2, ep=8)
        rc, out = verdict(f)
        if rc != 1 or "EP group(s) span nodes" not in out:
            failures.append(f"EP group across nodes not caught: {rc} {out}")

        # All 8 ranks on one node while 2 x 4 was asked.
        run_file(f, lambda r: 0, pp=2, dp=2, cp=2, ep=2)
        rc, out = verdict(f)
        if rc != 1 or "asked for 2 nodes" not in out:
            failures.append(f"wrong node count not caught: {rc} {out}")

        rc, out = verdict(os.path.join(d, "missing.h5"))
        if rc != 2:
            failures.append(f"missing file not exit 2: {rc} {out}")

    for msg in failures:
        print("FAIL:", msg)
    if not failures:
        print("check_mapping.py: every verdict as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
