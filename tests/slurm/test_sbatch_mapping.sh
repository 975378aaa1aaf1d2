#!/usr/bin/env bash
# sbatch of slurm/trident.sbatch on 2 virtual nodes x 4 tasks: the job
# completes, and its run file records the job id and a topology of 2 nodes
# with the pipeline stages on different nodes and each CP (and EP) group
# inside one node.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_cluster
require_h5py
make_workdir sbatch_mapping

steps=3
write_tiny_config "$WORK/tiny.toml" "$steps"
submit --job-name=t-sbatch --nodes=2 --ntasks-per-node=4 "$SBATCH_TEMPLATE" tiny.toml
jid=$JOB
note "submitted job $jid"
wait_job "$jid" 240
state=$STATE
log=$WORK/trident-$jid.out
exit_code=$(job_field "$jid" ExitCode)
note "job $jid ended $state, exit code $exit_code"
if [[ $state != COMPLETED || $exit_code != 0:0 ]]; then
  show_log "$log"
  fail "job $jid ended $state with exit code $exit_code, expected COMPLETED 0:0"
fi

# The template leaves output.file at its default, trident-%j.h5.
run=$WORK/trident-$jid.h5
[[ -f $run ]] || { show_log "$log"; fail "no run file $run (output.file = trident-%j.h5 must use the job id)"; }
ls "$WORK"

"$TRIDENT_PYTHON" "$CHECK_MAPPING" "$run" --nodes 2 --ranks-per-node 4 --node-names n1,n2 --job-id "$jid" ||
  fail "the run file's mapping is not what the job asked for"

# What check_mapping.py does not look at: detection (not an override), the
# mesh sizes, a finished run with every step.
"$TRIDENT_PYTHON" - "$run" "$steps" <<'PY' || fail "run file content"
import sys, h5py
path, steps = sys.argv[1], int(sys.argv[2])
def s(v):
    return v.decode() if isinstance(v, bytes) else str(v)
with h5py.File(path, "r") as f:
    t = f["topology"].attrs
    got = {k: int(t[k]) for k in ("nodes", "ranks_per_node", "pp", "dp", "cp", "ep")}
    want = {"nodes": 2, "ranks_per_node": 4, "pp": 2, "dp": 2, "cp": 2, "ep": 2}
    assert got == want, f"/topology attributes {got}, expected {want}"
    assert s(t["source"]) == "detected", f"topology source {s(t['source'])}: Slurm's nodes must be detected"
    assert int(f.attrs["world_size"]) == 8, f"world_size {f.attrs['world_size']}"
    assert int(f.attrs["completed"]) == 1, "run file not marked completed"
    rows = f["metrics/steps"][()]
    assert len(rows) == steps, f"{len(rows)} metrics rows, expected {steps}"
    print(f"run file ok: {got}, {len(rows)} steps, final loss {rows['loss'][-1]:.6f}")
PY
note "PASS"
