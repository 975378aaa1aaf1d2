# shellcheck shell=bash
# Shared by the lost-node tests (test_spare_restart.sh, test_spare_slurmd.sh;
# sourced after lib.sh): a 2-node job of 8 ranks with one spare (3 nodes
# allocated) that keeps the node-local tier (output.local_checkpoint_dir in
# /dev/shm, every step; Slurm's virtual nodes share this host, and each rank
# reads only its own node's directory) and loses node n2 mid-run, beside an
# uninterrupted reference job; then the checks: one job, no requeue, the
# restart on n1 and the spare n3 from the local tier, the tier removed, and
# the same losses and final checkpoint as the reference, bit for bit.

# A cluster of 3 nodes (SKIP with the reason on a smaller one), h5py.
require_spare_cluster() {
  require_cluster
  require_h5py
  local nodes
  nodes=$(sinfo -h -N -o '%N' | sort -u | wc -l)
  if [[ $nodes -lt 3 ]]; then
    echo "SKIP: the cluster has $nodes nodes; a job with a spare needs 3"
    exit 77
  fi
}

# An attempt's end, whatever it is: its jobs cancelled (lib.sh) and the
# local tier it named removed (a cancelled job's template may not get to it,
# and the lost node's directory is never the template's to remove).
spare_cleanup() {
  cancel_leftovers
  [[ -n ${LOCAL_DIR:-} ]] && rm -rf "$LOCAL_DIR"
  return 0
}

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

# start_spare_pair SUFFIX STEPS [SBATCH OPTIONS FOR THE SPARE JOB...]: writes
# job.toml (with the local tier) and ref.toml (without) in a clean work
# folder, submits the job with one spare (JID, LOG, LOCAL_DIR) and the
# reference (REF; kept off n2, the node the tests take away), and waits
# until the job has logged 5 steps.
start_spare_pair() {
  local suffix=$1 steps=$2 end
  shift 2
  make_workdir "spare$suffix"
  write_tiny_config "$WORK/job.toml" "$steps"
  cat >>"$WORK/job.toml" <<EOF

[output]
checkpoint_every = 4
timeline = false
EOF
  cp "$WORK/job.toml" "$WORK/ref.toml"
  LOCAL_DIR=/dev/shm/trident-test-spare-$$-$suffix
  cat >>"$WORK/job.toml" <<EOF
local_checkpoint_dir = "$LOCAL_DIR"
local_checkpoint_every = 1
EOF
  submit --job-name=t-spare --nodes=3 --ntasks-per-node=4 "$@" \
    --export=ALL,TRIDENT_BIN="$TRIDENT_BIN",TRIDENT_SPARE_NODES=1 "$SBATCH_TEMPLATE" job.toml \
    ${SPARE_RUN_ARGS[@]+"${SPARE_RUN_ARGS[@]}"}
  JID=$JOB
  submit --job-name=t-spare-ref --nodes=2 --ntasks-per-node=4 --exclude=n2 "$SBATCH_TEMPLATE" ref.toml \
    ${SPARE_RUN_ARGS[@]+"${SPARE_RUN_ARGS[@]}"}
  REF=$JOB
  LOG=$WORK/trident-$JID.out
  note "submitted job $JID (one spare, to lose a node) and $REF (reference)"
  end=$((SECONDS + 240))
  while [[ $(steps_logged "$LOG") -lt 5 ]]; do
    [[ $SECONDS -lt $end ]] || { show_log "$LOG"; fail "job $JID trained no 5 steps in 240 s"; }
    sleep 0.5
  done
}

# check_spare_pair STEPS: waits for both jobs and checks the outcome.
check_spare_pair() {
  local steps=$1
  wait_job "$JID" 300
  wait_job "$REF" 300
  show_log "$LOG"
  [[ $(job_field "$JID" JobState) == COMPLETED && $(job_field "$JID" ExitCode) == 0:0 ]] ||
    fail "job $JID ended $(job_field "$JID" JobState) $(job_field "$JID" ExitCode)"
  [[ $(job_field "$JID" Restarts) == 0 ]] || fail "job $JID was requeued; it should have gone on in place"
  grep -q "^trident.sbatch: node n2 failed (status [0-9]*): restart 1 of 3 on n1 n3" "$LOG" ||
    fail "the template did not restart the step on n1 and the spare n3"
  grep -q "^resuming from the local tier: step [0-9]*, complete across the nodes left" "$LOG" ||
    fail "the restart did not resume from the local tier"
  grep -q "^trident.sbatch: removed the local checkpoint tier $LOCAL_DIR/trident-$JID" "$LOG" &&
    [[ ! -e $LOCAL_DIR/trident-$JID ]] || fail "the template left the local tier $LOCAL_DIR/trident-$JID"
  "$TRIDENT_PYTHON" - "$WORK" "$JID" "$REF" "$steps" <<'EOF' || fail "the restarted job differs from the reference"
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
def text(v):
    return (v.decode() if isinstance(v, bytes) else str(v)).strip("\0")
# the template names each step's run file after the job: the restarted step wrote the same name
runs = sorted(glob.glob(os.path.join(work, "trident-%s*.h5" % jid)))
want = losses(os.path.join(work, "trident-%s.h5" % ref))
got = losses(runs[-1])
with h5py.File(runs[-1], "r") as f:
    ev = [r for r in f["events"][:] if text(r["kind"]) == "restart"] if "events" in f else []
ok = True
if not ev:
    print("FAIL no restart event in %s" % runs[-1]); ok = False
else:
    r = ev[0]
    detail = text(r["detail"])
    print("restart event: step %d, %.2f s from the failure to the first step after it, %d step(s) lost, %s"
          % (r["step"], r["value"], r["reference"], detail))
    ok &= "n2" in detail and "local tier" in detail and r["reference"] >= 0
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
