#!/usr/bin/env bash
# Stops the local test cluster that start.sh started in $TRIDENT_SLURM_DIR
# (default /tmp/trident-slurm): cancels its jobs, then ends every daemon
# named by a pid file there (slurmd per node, slurmctld, munged), and nothing
# else. Safe to run twice.
set -uo pipefail

dir=${TRIDENT_SLURM_DIR:-/tmp/trident-slurm}
conf=$dir/slurm.conf
deadline_s=${TRIDENT_SLURM_STOP_TIMEOUT:-30}

say() { echo "stop.sh: $*" >&2; }
alive() { kill -0 "$1" 2>/dev/null; }

if [[ ! -d $dir/run ]]; then
  say "nothing to stop in $dir"
  exit 0
fi

# Jobs first, while slurmctld and the slurmds can still end their steps:
# slurmstepd processes are not our children and would outlive the daemons.
if [[ -f $conf && -f $dir/run/slurmctld.pid ]] && alive "$(cat "$dir/run/slurmctld.pid")"; then
  export SLURM_CONF=$conf
  jobs=$(timeout 10 squeue -h -o '%A' 2>/dev/null || true)
  if [[ -n $jobs ]]; then
    say "cancelling jobs: $(echo $jobs)"
    timeout 10 scancel $jobs 2>/dev/null || true
    end=$((SECONDS + deadline_s))
    while [[ -n $(timeout 10 squeue -h -o '%A' 2>/dev/null || true) && $SECONDS -lt $end ]]; do
      sleep 1
    done
  fi
fi

# Then the daemons, each by its own pid file: TERM, wait, KILL if still there.
stop_pidfile() {
  local f=$1 pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if [[ $pid =~ ^[0-9]+$ ]] && alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null
    local end=$((SECONDS + deadline_s))
    while alive "$pid" && [[ $SECONDS -lt $end ]]; do sleep 0.2; done
    if alive "$pid"; then
      say "$(basename "$f" .pid) ($pid) ignored TERM; killing it"
      kill -KILL "$pid" 2>/dev/null
    fi
    say "stopped $(basename "$f" .pid) ($pid)"
  fi
  rm -f "$f"
}
for f in "$dir"/run/slurmd-*.pid; do stop_pidfile "$f"; done
stop_pidfile "$dir/run/slurmctld.pid"
stop_pidfile "$dir/run/munged.pid"
exit 0
