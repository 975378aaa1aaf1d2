#!/usr/bin/env bash
# A lost node inside the allocation (TRIDENT_SPARE_NODES): a 2-node job with
# one spare (3 nodes allocated) whose ranks on one node are SIGKILLed mid-run
# goes on in the same allocation, on the spare, from the newest checkpoint:
# one job, no requeue, and the same losses and final checkpoint as an
# uninterrupted job, bit for bit. The restarted step's run file holds a
# `restart` event naming the node left out. The job keeps the node-local
# tier (output.local_checkpoint_dir in /dev/shm, every step; Slurm's virtual
# nodes share this host, and each rank reads only its own node's directory):
# the restart resumes from it, n2's shards coming from their partner copies
# on n1, and the event says so; the template removes the tier at the end.
# Needs a cluster of 3 nodes (SKIP with the reason on a smaller one).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_cluster
require_h5py

nodes=$(sinfo -h -N -o '%N' | sort -u | wc -l)
if [[ $nodes -lt 3 ]]; then
  echo "SKIP: the cluster has $nodes nodes; a job with a spare needs 3"
  exit 77
fi
steps=${TRIDENT_SPARE_STEPS:-12}

steps_logged() { grep -Ec '^step +[0-9]+ \|' "$1" 2>/dev/null || true; }

# The trident processes of job $1 on node $2 (Slurm's virtual nodes share
# this host: each task's environment names its node).
pids_on() {
  local pid env
  for pid in $(pgrep -f "trident run"); do
    env=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null) || continue
    grep -qx "SLURM_JOB_ID=$1" <<<"$env" && grep -qx "SLURMD_NODENAME=$2" <<<"$env" && echo "$pid"
  done
}

attempt() {
  make_workdir "spare$1"
  write_tiny_config "$WORK/job.toml" "$steps"
  cat >>"$WORK/job.toml" <<EOF

[output]
checkpoint_every = 4
timeline = false
EOF
  cp "$WORK/job.toml" "$WORK/ref.toml"
  local_dir=/dev/shm/trident-test-spare-$$-$1
  cat >>"$WORK/job.toml" <<EOF
local_checkpoint_dir = "$local_dir"
local_checkpoint_every = 1
EOF
  submit --job-name=t-spare --nodes=3 --ntasks-per-node=4 \
    --export=ALL,TRIDENT_BIN="$TRIDENT_BIN",TRIDENT_SPARE_NODES=1 "$SBATCH_TEMPLATE" job.toml
  jid=$JOB
  submit --job-name=t-spare-ref --nodes=2 --ntasks-per-node=4 "$SBATCH_TEMPLATE" ref.toml
  ref=$JOB
  note "submitted job $jid (one spare, to lose a node) and $ref (reference)"
  log=$WORK/trident-$jid.out
  end=$((SECONDS + 240))
  while [[ $(steps_logged "$log") -lt 5 ]]; do
    [[ $SECONDS -lt $end ]] || { show_log "$log"; fail "job $jid trained no 5 steps in 240 s"; }
    sleep 0.5
  done
  victims=$(pids_on "$jid" n2)
  [[ -n $victims ]] || { show_log "$log"; fail "no trident process of job $jid on n2"; }
  kill -KILL $victims
  note "SIGKILLed the ranks of job $jid on n2 (pids $(echo $victims)) after $(steps_logged "$log") steps"
  wait_job "$jid" 300
  wait_job "$ref" 300
  show_log "$log"
  [[ $(job_field "$jid" JobState) == COMPLETED && $(job_field "$jid" ExitCode) == 0:0 ]] ||
    fail "job $jid ended $(job_field "$jid" JobState) $(job_field "$jid" ExitCode)"
  [[ $(job_field "$jid" Restarts) == 0 ]] || fail "job $jid was requeued; it should have gone on in place"
  grep -q "^trident.sbatch: node n2 failed (status [0-9]*): restart 1 of 3 on n1 n3" "$log" ||
    fail "the template did not restart the step on n1 and the spare n3"
  grep -q "^resuming from the local tier: step [0-9]*, complete across the nodes left" "$log" ||
    fail "the restart did not resume from the local tier"
  grep -q "^trident.sbatch: removed the local checkpoint tier $local_dir/trident-$jid" "$log" &&
    [[ ! -e $local_dir/trident-$jid ]] || fail "the template left the local tier $local_dir/trident-$jid"
  rmdir "$local_dir" 2>/dev/null
  "$TRIDENT_PYTHON" - "$WORK" "$jid" "$ref" "$steps" <<'EOF' || fail "the restarted job differs from the reference"
import glob, os, sys
import h5py, numpy as np
work, jid, ref, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def losses(path):
    with h5py.File(path, "r") as f:
        return {int(r["step"]): float(r["loss"]) for r in f["metrics/steps"][:]}
def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f["tensors"].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
# the template names each step's run file after the job: the restarted step wrote the same name
runs = sorted(glob.glob(os.path.join(work, "trident-%s*.h5" % jid)))
want = losses(os.path.join(work, "trident-%s.h5" % ref))
got = losses(runs[-1])
with h5py.File(runs[-1], "r") as f:
    ev = [r for r in f["events"][:] if r["kind"].decode().strip("\0") == "restart"] if "events" in f else []
ok = True
if not ev:
    print("FAIL no restart event in %s" % runs[-1]); ok = False
else:
    r = ev[0]
    print("restart event: step %d, %.2f s from the failure to the first step after it, %d step(s) lost, %s"
          % (r["step"], r["value"], r["reference"], r["detail"].decode().strip("\0")))
    ok &= "n2" in r["detail"].decode() and "local tier" in r["detail"].decode() and r["reference"] >= 0
same = all(got[s] == want[s] for s in got)
print("losses after the restart equal the reference's (%d steps): %s" % (len(got), same))
final = "ckpt_step_%08d.h5" % steps
a = tensors(os.path.join(work, "checkpoints", jid, final))
b = tensors(os.path.join(work, "checkpoints", ref, final))
bits = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
print("final checkpoint bit for bit (%d tensors): %s" % (len(a), bits))
sys.exit(0 if ok and same and bits and max(got) == steps - 1 else 1)
EOF
}

with_stall_retry attempt
echo "PASS: a node lost inside the allocation: restarted on the spare, bit for bit"
