# Shared by the slurm tests (sourced): finds the local cluster (a SKIP when it
# is not up, a failure where scripts/test.sh started it), makes a clean work
# folder per test, submits and waits for jobs with a deadline, and cancels on
# exit whatever the test left running.
# ctest passes TRIDENT_BIN, TRIDENT_SOURCE_DIR, TRIDENT_PYTHON, TRIDENT_BUILD_DIR;
# scripts/test.sh sets TRIDENT_SLURM_REQUIRED=1.
set -uo pipefail

: "${TRIDENT_BIN:?run under ctest (TRIDENT_BIN is not set)}"
: "${TRIDENT_SOURCE_DIR:?run under ctest (TRIDENT_SOURCE_DIR is not set)}"
TRIDENT_PYTHON=${TRIDENT_PYTHON:-$TRIDENT_SOURCE_DIR/.venv/bin/python3}
export SLURM_CONF=${SLURM_CONF:-${TRIDENT_SLURM_DIR:-/tmp/trident-slurm}/slurm.conf}
SBATCH_TEMPLATE=$TRIDENT_SOURCE_DIR/slurm/trident.sbatch
CHECK_MAPPING=$TRIDENT_SOURCE_DIR/slurm/check_mapping.py

note() { echo "-- $*"; }

# Signs so far that the machine stopped running its processes for a while:
# the kernel's watchdog reports of CPU starvation (dmesg; ~59 s and more) and
# slurmctld's log of a slurmd or client on this same host that did not answer
# within MessageTimeout (20 s), which a daemon with work to do only misses when
# it gets no CPU. On this shared 2-core VM both have been seen for about a
# minute at a time (slurm/README.md); a test that fails says whether it
# happened while it ran. Unreadable sources count as none.
stall_reports() {
  local k s h
  k=$(dmesg 2>/dev/null | grep -cE 'rcu_preempt detected stalls|workqueue lockup|soft lockup')
  s=$(grep -cE 'slurm_receive_msgs?: .*Socket timed out' "$(dirname "$SLURM_CONF")/log/slurmctld.log" 2>/dev/null)
  h=$(grep -c . "$HEARTBEAT_LOG" 2>/dev/null)
  echo $((${k:-0} + ${s:-0} + ${h:-0}))
}

# The third sign, and the quickest: this shell's own heartbeat, a 1 s sleep in
# a loop, that finds more than 10 s gone between two beats (seen here: both
# CPUs held 15-30 s at once while steal time stayed flat).
HEARTBEAT_LOG=$(mktemp "${TMPDIR:-/tmp}/trident-heartbeat.XXXXXX")
(
  last=${EPOCHREALTIME/./}
  while sleep 1 && kill -0 $$ 2>/dev/null; do  # ends with the test, however it ends
    now=${EPOCHREALTIME/./}
    if ((now - last > 11000000)); then
      echo "$(date -u +%T): $(((now - last) / 1000000)) s between 1 s heartbeats" >>"$HEARTBEAT_LOG"
    fi
    last=$now
  done
) </dev/null >/dev/null 2>&1 &
HEARTBEAT_PID=$!
STALLS_AT_START=$(stall_reports)
stalled_since_start() { [[ $(stall_reports) -gt $STALLS_AT_START ]]; }

# with_stall_retry ATTEMPT: runs the function ATTEMPT (argument "", its work
# folder suffix) in a subshell, so that fail() ends the attempt, not the test,
# and the attempt's jobs are cancelled when it ends; exits with its verdict. A
# second attempt (argument "-2") only when the machine stalled during the
# first (stall_reports): then trident's ranks, slurmd and munged all went
# without CPU time for that long, and trident's deadlines (runtime.timeout_s)
# or Slurm's could pass with nothing wrong in trident. Without such a sign a
# failure is a failure.
with_stall_retry() {
  local attempt=$1 before
  before=$(stall_reports)
  (trap cancel_leftovers EXIT; "$attempt" "") && exit 0
  [[ $(stall_reports) -gt $before ]] || exit 1
  note "RETRY: the machine stalled during the attempt above (a dmesg CPU stall report, a Slurm daemon silent for 20 s in slurmctld.log, or this test's 1 s heartbeat missing for over 10 s); running it once more (work folder suffix -2)"
  (trap cancel_leftovers EXIT; "$attempt" "-2")
  exit $?
}

fail() {
  echo "FAIL: $*" >&2
  if stalled_since_start; then
    echo "note: while this test ran the machine stopped running processes for a while (dmesg: a CPU stall report; slurmctld.log: a daemon on this host silent for 20 s; or this test's 1 s heartbeat missing for over 10 s); see slurm/README.md" >&2
  fi
  exit 1
}

# The cluster must be up. Without it the test cannot run: under a bare ctest
# that is a SKIP (exit 77, ctest's SKIP_RETURN_CODE for these tests) with the
# reason; where scripts/test.sh started the cluster (TRIDENT_SLURM_REQUIRED=1,
# as in CI) it is a failure, so a run that was meant to exercise Slurm cannot
# pass without it.
no_cluster() {
  local why="needs the local Slurm cluster: slurm/cluster/start.sh, which scripts/test.sh runs ($*)"
  [[ ${TRIDENT_SLURM_REQUIRED:-0} == 1 ]] && fail "$why"
  echo "SKIP: $why"
  exit 77
}
# Nodes still "completing" the previous test's job (its epilog, its steps'
# ends) become idle within seconds to a minute: wait for them rather than
# refuse, up to 120 s.
require_cluster() {
  local idle n end=$((SECONDS + 120))
  while :; do
    if ! idle=$(timeout 15 sinfo -h -N -o '%N %T' 2>/dev/null); then
      no_cluster "no answer from slurmctld with SLURM_CONF=$SLURM_CONF"
    fi
    n=$(awk '$2 ~ /^(idle|mixed|allocated)/ {print $1}' <<<"$idle" | sort -u | wc -l)
    [[ $n -ge 2 ]] && return 0
    grep -q 'completing' <<<"$idle" && [[ $SECONDS -lt $end ]] || break
    sleep 2
  done
  no_cluster "2 usable nodes wanted, sinfo says: $(echo $idle)"
}

require_h5py() {
  "$TRIDENT_PYTHON" -c 'import h5py, numpy' 2>/dev/null ||
    fail "$TRIDENT_PYTHON cannot import h5py and numpy: run scripts/install-deps.sh"
}

# A clean folder for this test's jobs (logs, run files, checkpoints).
make_workdir() {
  WORK=${TRIDENT_BUILD_DIR:-/tmp}/tests/slurm/work/$1
  rm -rf "$WORK"
  mkdir -p "$WORK"
}

SUBMITTED=()
cancel_leftovers() {
  local j state
  if [[ $BASHPID == "$$" ]]; then  # the test's own shell, not an attempt's subshell
    kill "$HEARTBEAT_PID" 2>/dev/null
    [[ -s $HEARTBEAT_LOG ]] && sed 's/^/-- machine held: /' "$HEARTBEAT_LOG"
    rm -f "$HEARTBEAT_LOG"
  fi
  for j in "${SUBMITTED[@]}"; do
    state=$(job_field "$j" JobState 1)
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) ;;
      *) scancel "$j" 2>/dev/null ;;  # running, waiting, or no answer: cancel to be sure
    esac
  done
}
trap cancel_leftovers EXIT

# submit ARGS...: sbatch with the template's environment; sets JOB to the id.
submit() {
  local out
  out=$(sbatch --parsable --chdir="$WORK" --export=ALL,TRIDENT_BIN="$TRIDENT_BIN" "$@") ||
    fail "sbatch $* was refused"
  JOB=${out%%;*}
  SUBMITTED+=("$JOB")
}

# job_field JOBID FIELD [TRIES]: one field of `scontrol show job` (e.g.
# JobState, ExitCode). No answer from slurmctld is not a value: each try waits
# 15 s, an unanswered one is logged and asked again (TRIES, default 6: past the
# minute-long stalls seen here); after the last, prints nothing and returns 1.
# Callers that poll treat that as "not known yet" and keep their own deadline.
job_field() {
  local jid=$1 field=$2 tries=${3:-6} i out
  for ((i = 1; i <= tries; i++)); do
    if out=$(timeout 15 scontrol show job "$jid" 2>&1); then
      tr ' ' '\n' <<<"$out" | sed -n "s/^$field=//p" | head -n 1
      return 0
    fi
    note "scontrol show job $jid: no answer within 15 s (try $i of $tries: ${out:-timed out}); asking again" >&2
  done
  return 1
}

# wait_job JOBID SECONDS: waits for a final state and sets STATE to it;
# fails at the deadline.
wait_job() {
  local jid=$1 end=$((SECONDS + $2)) state
  while :; do
    state=$(job_field "$jid" JobState) || state=UNKNOWN
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        STATE=$state
        return 0
        ;;
    esac
    if [[ $SECONDS -ge $end ]]; then
      scancel "$jid" 2>/dev/null
      [[ -f $WORK/trident-$jid.out ]] && tail -n 40 "$WORK/trident-$jid.out" >&2
      fail "job $jid still $state after $2 s; cancelled"
    fi
    sleep 1
  done
}

show_log() {
  echo "---- $1 ----"
  cat "$1" 2>/dev/null || echo "(no log)"
  echo "----"
}

# The small model every slurm test trains: 8 ranks as pp=2 x cp=2 x dp=2,
# ep=2, a few steps. Extra TOML lines (a [train] override, ...) may follow.
write_tiny_config() {
  local path=$1 steps=${2:-3}
  cat >"$path" <<EOF
# slurm tests: tiny MoE model on 2 nodes x 4 ranks (pp=2, cp=2, dp=2, ep=2)
[model]
vocab_size = 32
d_model = 32
n_layers = 2
n_heads = 2
n_kv_heads = 2
ffn_hidden = 64
n_experts = 4
top_k = 2

[data]
seq_len = 32
micro_batch_size = 1
num_microbatches = 2

[parallel]
pp = 2
cp = 2
ep = 2

[train]
steps = $steps
warmup_steps = 1

[runtime]
timeout_s = 60
EOF
}
