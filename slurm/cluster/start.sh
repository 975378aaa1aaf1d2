#!/usr/bin/env bash
# Starts a real Slurm cluster of N virtual nodes on this one machine, for
# trident's slurm tests and for trying the sbatch template without a cluster:
# our own munged, slurmctld, and one slurmd per node, all state under
# $TRIDENT_SLURM_DIR (default /tmp/trident-slurm). Stop it with stop.sh.
#
#   slurm/cluster/start.sh [N]        # N virtual nodes, default 2
#   eval "$(slurm/cluster/start.sh 2 | grep '^export')"
#
# Environment: TRIDENT_SLURM_DIR, TRIDENT_SLURM_CPUS (CPUs each node claims,
# default 8), TRIDENT_SLURM_PORT (slurmctld port, default 16817; the nodes use
# the following 1000+i ports), TRIDENT_SLURM_START_TIMEOUT (seconds, default 90).
set -euo pipefail

nodes=${1:-2}
if ! [[ $nodes =~ ^[1-9][0-9]*$ ]]; then
  echo "start.sh: N must be a positive number of nodes, got '$nodes'" >&2
  exit 2
fi
dir=${TRIDENT_SLURM_DIR:-/tmp/trident-slurm}
cpus=${TRIDENT_SLURM_CPUS:-8}
ctld_port=${TRIDENT_SLURM_PORT:-16817}
deadline_s=${TRIDENT_SLURM_START_TIMEOUT:-90}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
conf=$dir/slurm.conf

say() { echo "start.sh: $*" >&2; }
die() { say "$*"; exit 1; }

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# An already running cluster of this folder is reused, not started twice.
if [[ -f $conf ]] && alive "$dir/run/slurmctld.pid" &&
   SLURM_CONF=$conf timeout 10 sinfo -h >/dev/null 2>&1; then
  running=$(SLURM_CONF=$conf sinfo -h -N -o '%N' | sort -u | wc -l)
  if [[ $running -eq $nodes ]]; then
    say "a cluster of $running nodes is already running in $dir"
    echo "export SLURM_CONF=$conf"
    exit 0
  fi
  die "a cluster of $running nodes (not $nodes) is running in $dir: stop it first (slurm/cluster/stop.sh)"
fi

# ---- packages ----
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null ||
   ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
  if [[ $(id -u) -ne 0 ]]; then
    die "slurm-wlm and munge are missing; run as root, or: sudo apt-get install slurm-wlm munge"
  fi
  say "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi
if [[ $(id -u) -ne 0 ]]; then
  die "the local cluster runs its daemons as root (SlurmUser=root); run as root"
fi

# ---- folders and config ----
mkdir -p "$dir"/{state,run,log,munge}
for i in $(seq 1 "$nodes"); do mkdir -p "$dir/spool/n$i" "$dir/tmp/n$i"; done
chmod 700 "$dir/munge"
if [[ $nodes -eq 1 ]]; then
  node_ports=$((ctld_port + 1001))
else
  node_ports=$((ctld_port + 1001))-$((ctld_port + 1000 + nodes))
fi
sed -e "s|@DIR@|$dir|g" -e "s|@NODES@|$nodes|g" -e "s|@CPUS@|$cpus|g" \
    -e "s|@CTLD_PORT@|$ctld_port|g" -e "s|@NODE_PORTS@|$node_ports|g" \
    "$here/slurm.conf.in" >"$conf"
# The package's plugstack.conf may name SPANK plugins we do not want; an
# empty one keeps the test cluster independent of the host's setup.
: >"$dir/plugstack.conf"
echo "PlugStackConfig=$dir/plugstack.conf" >>"$conf"
export SLURM_CONF=$conf

# ---- munge ----
if ! alive "$dir/run/munged.pid"; then
  [[ -f $dir/munge/munge.key ]] || mungekey -c -k "$dir/munge/munge.key" >/dev/null 2>&1 ||
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$dir/munge/munge.key"
  munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" 2>>"$dir/log/munged.log" ||
    die "munged did not start; see $dir/log/munged.log"
fi

# ---- slurmctld and one slurmd per node ----
# -c: forget job state of an earlier cluster in this folder.
slurmctld -f "$conf" -c || die "slurmctld did not start; see $dir/log/slurmctld.log"
for i in $(seq 1 "$nodes"); do
  slurmd -f "$conf" -N "n$i" || die "slurmd n$i did not start; see $dir/log/slurmd-n$i.log"
done

# ---- wait until every node is idle ----
end=$((SECONDS + deadline_s))
while :; do
  idle=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l || true)
  [[ $idle -eq $nodes ]] && break
  if [[ $SECONDS -ge $end ]]; then
    sinfo -N -l >&2 || true
    die "nodes not idle after ${deadline_s}s; logs in $dir/log (stop with slurm/cluster/stop.sh)"
  fi
  sleep 1
done
say "$nodes nodes idle (n1..n$nodes); state and logs in $dir"
echo "export SLURM_CONF=$conf"
