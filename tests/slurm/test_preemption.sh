#!/usr/bin/env bash
# Preemption under Slurm: a running trident job gets USR1 in its batch shell
# (scancel --signal=USR1 --batch, as Slurm does before a time limit), the
# template forwards it to the step, trident checkpoints and stops, the job is
# requeued, resumes from the checkpoint (SLURM_RESTART_COUNT > 0) and ends
# with the same losses as an uninterrupted job of the same config.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_cluster
require_h5py

steps=${TRIDENT_PREEMPT_STEPS:-20}

# Progress lines so far in a job's log: rank 0 prints "step N | loss ..." and
# flushes after every step. A grep, polled twice a second, costs nothing next
# to starting Python and h5py that often on 2 cores busy with the job.
steps_logged() { grep -Ec '^step +[0-9]+ \|' "$1" 2>/dev/null || true; }

# One attempt (lib.sh, with_stall_retry): preempt a job, let it requeue and
# resume, compare its losses with an uninterrupted job's.
attempt() {
  make_workdir "preemption$1"
  write_tiny_config "$WORK/long.toml" "$steps"
  submit --job-name=t-preempted --nodes=2 --ntasks-per-node=4 "$SBATCH_TEMPLATE" long.toml
  jid=$JOB
  note "submitted job $jid (to be preempted)"
  log=$WORK/trident-$jid.out
  run=$WORK/trident-$jid.h5

  # Wait until it has trained at least 2 steps, then signal its batch shell.
  end=$((SECONDS + 180))
  while :; do
    n=$(steps_logged "$log")
    [[ $n -ge 2 ]] && break
    state=$(job_field "$jid" JobState) || state=UNKNOWN
    if [[ $state != PENDING && $state != RUNNING && $state != CONFIGURING && $state != UNKNOWN ]]; then
      show_log "$log"
      fail "job $jid is $state before it trained 2 steps"
    fi
    [[ $SECONDS -lt $end ]] || { show_log "$log"; fail "job $jid trained no 2 steps in 180 s"; }
    sleep 0.5
  done
  scancel --signal=USR1 --batch "$jid" || fail "scancel --signal=USR1 --batch $jid refused"
  note "sent USR1 to job $jid after $n step(s)"

  # The uninterrupted reference, same config.
  submit --job-name=t-reference --nodes=2 --ntasks-per-node=4 "$SBATCH_TEMPLATE" long.toml
  ref=$JOB
  note "submitted job $ref (uninterrupted reference)"

  # While the preempted job waits to start again, its checkpoint must exist.
  ckpt_dir=$WORK/checkpoints/$jid
  saw_requeue=0
  saw_ckpt=0
  end=$((SECONDS + 240))
  while :; do
    state=$(job_field "$jid" JobState) || state=UNKNOWN
    restarts=$(job_field "$jid" Restarts) || restarts=0
    if [[ ${restarts:-0} -ge 1 ]]; then
      saw_requeue=1
      if [[ $state == PENDING ]] && compgen -G "$ckpt_dir/*" >/dev/null; then saw_ckpt=1; fi
    fi
    case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL) break ;; esac
    [[ $SECONDS -lt $end ]] || { show_log "$log"; fail "job $jid still $state after 240 s"; }
    sleep 1
  done
  show_log "$log"
  exit_code=$(job_field "$jid" ExitCode)
  note "job $jid ended $state, exit code $exit_code, restarts $(job_field "$jid" Restarts)"
  [[ $state == COMPLETED && $exit_code == 0:0 ]] || fail "preempted job ended $state $exit_code"
  [[ $saw_requeue -eq 1 ]] || fail "job $jid was never requeued (Restarts stayed 0)"
  grep -q '^trident.sbatch: USR1 received' "$log" || fail "the batch shell did not trap USR1"
  grep -q "^trident.sbatch: checkpoint written; requeueing job $jid" "$log" ||
    fail "trident did not stop cleanly after USR1, so the job was not requeued"
  grep -q "^trident.sbatch: job $jid restart 1:" "$log" || fail "no second start with SLURM_RESTART_COUNT=1"
  [[ $saw_ckpt -eq 1 ]] || fail "no checkpoint in $ckpt_dir while the job waited to be restarted"

  # Resumed, not started over: rank 0 prints "step N | loss ..." per step and,
  # on a resume, "resumed from CKPT at step K".
  first=$(sed -n "1,/^trident.sbatch: checkpoint written; requeueing/p" "$log" | grep -Ec '^step +[0-9]+ \|')
  second=$(sed -n "/^trident.sbatch: job $jid restart 1:/,\$p" "$log" | grep -Ec '^step +[0-9]+ \|')
  resumed=$(sed -n "/^trident.sbatch: job $jid restart 1:/,\$p" "$log" | grep -E '^resumed from .* at step [0-9]+' | head -n 1)
  note "progress lines: $first before the requeue, $second after it ($steps steps); '$resumed'"
  [[ $first -ge 2 ]] || fail "fewer than 2 progress lines before the requeue"
  [[ $first -lt $steps ]] || fail "the first start ran every step: USR1 did not stop it early"
  [[ -n $resumed ]] || fail "the restarted job did not say it resumed from a checkpoint"
  [[ $resumed == "resumed from $ckpt_dir/"* || $resumed == "resumed from checkpoints/$jid/"* ]] ||
    fail "it resumed from a checkpoint outside this job's folder: $resumed"
  k=${resumed##* at step }
  [[ $k -ge 1 && $k -lt $steps ]] || fail "resumed at step $k, expected between 1 and $((steps - 1))"
  [[ $second -ge 1 && $second -le $((steps - k)) ]] ||
    fail "the restarted job ran $second steps, expected at most the $((steps - k)) left after step $k"

  wait_job "$ref" 240
  state=$STATE
  [[ $state == COMPLETED ]] || { show_log "$WORK/trident-$ref.out"; fail "reference job $ref ended $state"; }

  "$TRIDENT_PYTHON" - "$run" "$WORK/trident-$ref.h5" "$steps" <<'PY' || fail "losses differ from the uninterrupted run"
import sys, h5py
resumed, reference, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def losses(path):
    with h5py.File(path, "r") as f:
        rows = f["metrics/steps"][()]
    return {int(s): float(l) for s, l in zip(rows["step"], rows["loss"])}
a, b = losses(resumed), losses(reference)
assert len(b) == steps, f"reference has {len(b)} steps, expected {steps}"
last = max(b)
assert last in a, f"the resumed run has no row for the final step {last}"
# DESIGN.md: a resumed run continues bit-for-bit, so equal means equal.
bad = [(s, a[s], b[s]) for s in sorted(a) if a[s] != b.get(s)]
assert not bad, f"steps whose loss differs (step, resumed, reference): {bad[:5]}"
print(f"final step {last}: loss {a[last]!r} in both; {len(a)} resumed-file rows all equal the reference")
PY
  note "PASS"
}

with_stall_retry attempt
