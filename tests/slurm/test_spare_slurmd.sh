#!/usr/bin/env bash
# A node that goes dark inside the allocation (TRIDENT_SPARE_NODES): the
# second variant of test_spare_restart.sh. Mid-run, node n2's slurmd is
# stopped and the job's processes on n2 (its slurmstepd and trident ranks)
# are frozen with SIGSTOP, as a node that lost power or hung: nothing on it
# answers or exits, so no task exit tells srun anything. Slurm marks n2 down
# after SlurmdTimeout (30 s on the local cluster); the job, submitted with
# --no-kill, keeps its allocation, srun reports "Node failure on n2", and the
# template starts the step again on n1 and the spare n3 from the local tier:
# one job, no requeue, the same losses and final checkpoint as an
# uninterrupted job, bit for bit (spare_lib.sh). trident's own deadline is
# raised to 150 s so that Slurm, not trident, sees the lost node first.
# Prints the seconds from stopping the node to the template's restart and to
# the first step after it.
#
# Whatever the end, the frozen processes are killed (a dead node's processes
# are gone) and n2's slurmd is started again (restore_n2, on every exit),
# and the test waits until n2 is back in service for the tests after it.
# Needs a cluster of 3 nodes (SKIP with the reason on a smaller one).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/spare_lib.sh"
require_spare_cluster
steps=${TRIDENT_SPARE_STEPS:-12}
SPARE_RUN_ARGS=(--set runtime.timeout_s=150)
SLURM_DIR=$(dirname "$SLURM_CONF")
SLURMD_PID_FILE=$SLURM_DIR/run/slurmd-n2.pid
# What the test stopped, for restore_n2: "ranks PIDS" and "stepd PID" lines,
# "slurmd" once n2's slurmd was stopped.
STOPPED=$(mktemp "${TMPDIR:-/tmp}/trident-stopped.XXXXXX")

slurmd_alive() { [[ -f $SLURMD_PID_FILE ]] && kill -0 "$(cat "$SLURMD_PID_FILE")" 2>/dev/null; }
n2_state() { timeout 15 sinfo -h -N -n n2 -o '%T' 2>/dev/null | head -1; }

restore_n2() {
  local ranks stepd end state
  [[ -s $STOPPED ]] || return 0
  ranks=$(sed -n 's/^ranks //p' "$STOPPED")
  stepd=$(sed -n 's/^stepd //p' "$STOPPED")
  # shellcheck disable=SC2086  # lists of pids
  [[ -n $ranks ]] && kill -KILL $ranks 2>/dev/null
  [[ -n $stepd ]] && kill -CONT "$stepd" 2>/dev/null  # it sees its tasks end and finishes
  if grep -qx slurmd "$STOPPED" && ! slurmd_alive; then
    slurmd -f "$SLURM_CONF" -N n2 || echo "-- restore: slurmd -N n2 did not start; see $SLURM_DIR/log/slurmd-n2.log" >&2
  fi
  : >"$STOPPED"
  end=$((SECONDS + 120))
  while state=$(n2_state); [[ $state != idle* && $state != mixed* && $state != allocated* ]]; do
    if [[ $SECONDS -ge $end ]]; then
      echo "-- restore: n2 is '$state' 120 s after its slurmd started again" >&2
      return 1
    fi
    [[ $state == down* ]] && timeout 15 scontrol update nodename=n2 state=resume 2>/dev/null
    sleep 2
  done
  note "restored n2: slurmd running again, node $state"
}
trap 'restore_n2; cancel_leftovers; rm -f "$STOPPED"' EXIT
slurmd_alive || fail "n2's slurmd is not running ($SLURMD_PID_FILE)"

# epoch seconds when LOG first holds a line matching PATTERN, within SECONDS
time_of_line() {
  local end=$((SECONDS + $3))
  until grep -qE "$2" "$1" 2>/dev/null; do
    [[ $SECONDS -lt $end ]] || return 1
    sleep 0.25
  done
  date +%s.%N
}

attempt() {
  trap 'restore_n2; spare_cleanup' EXIT
  start_spare_pair "$1" "$steps" --no-kill
  local ranks stepd t_stop t_restart t_first before
  ranks=$(pids_on "$JID" n2 | xargs)
  [[ -n $ranks ]] || { show_log "$LOG"; fail "no trident process of job $JID on n2"; }
  stepd=$(ps -o ppid= -p "${ranks%% *}" | tr -d ' ')
  [[ $(ps -o comm= -p "$stepd") == slurmstepd ]] || fail "the parent of rank ${ranks%% *} is no slurmstepd"
  {
    echo "stepd $stepd"
    echo "ranks $ranks"
  } >"$STOPPED"
  t_stop=$(date +%s.%N)
  kill -STOP "$stepd" $ranks
  echo slurmd >>"$STOPPED"
  kill -TERM "$(cat "$SLURMD_PID_FILE")"
  before=$(steps_logged "$LOG")
  note "stopped n2's slurmd and froze job $JID's slurmstepd ($stepd) and ranks ($ranks) on n2 after $before steps"
  t_restart=$(time_of_line "$LOG" '^trident.sbatch: node n2 failed' 240) || {
    show_log "$LOG"
    fail "the template did not restart the step within 240 s of stopping n2"
  }
  local n end=$((SECONDS + 240))
  n=$(steps_logged "$LOG")
  while [[ $(steps_logged "$LOG") -le $n ]]; do
    [[ $SECONDS -lt $end ]] || { show_log "$LOG"; fail "no step after the restart within 240 s"; }
    sleep 0.25
  done
  t_first=$(date +%s.%N)
  note "$(awk -v a="$t_stop" -v b="$t_restart" -v c="$t_first" 'BEGIN {printf "n2 stopped -> restart started: %.1f s (Slurm marking n2 down, srun ending the step); -> first step after it: %.1f s", b - a, c - a}')"
  check_spare_pair "$steps"
  restore_n2 || fail "n2 did not come back into service after its slurmd started again"
}

with_stall_retry attempt
echo "PASS: a node whose slurmd stopped: restarted on the spare in the same allocation, bit for bit"
