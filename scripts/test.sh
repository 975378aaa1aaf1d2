#!/usr/bin/env bash
# The README's second command, and CI's whole job (.ci/run): installs what is
# missing (Slurm included), builds, starts the local Slurm cluster for the
# slurm-labelled tests, runs every test, stops the cluster it started, and
# exits with ctest's status. Extra arguments go to ctest (e.g. -L slurm).
#
# Environment: TRIDENT_BUILD_DIR (default build/), TRIDENT_CTEST_JOBS (default
# 2: MPI tests declare PROCESSORS 2, so ctest runs them one at a time on a
# 2-core machine while unit tests fill the gaps), TRIDENT_SLURM_DIR.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TRIDENT_BUILD_DIR:-$repo/build}
export TRIDENT_SLURM_DIR=${TRIDENT_SLURM_DIR:-/tmp/trident-slurm}

"$repo/scripts/install-deps.sh" --slurm
"$repo/scripts/build.sh"

# A cluster somebody already runs in this folder is used and left running;
# one we start is stopped on every way out of this script.
conf=$TRIDENT_SLURM_DIR/slurm.conf
if [[ -f $conf ]] && SLURM_CONF=$conf timeout 10 sinfo -h >/dev/null 2>&1; then
  echo "test.sh: using the Slurm cluster already running in $TRIDENT_SLURM_DIR" >&2
else
  trap '"$repo/slurm/cluster/stop.sh"' EXIT
  # 3 nodes: the jobs take 2, slurm_spare_restart a spare beside them
  "$repo/slurm/cluster/start.sh" 3 >/dev/null
fi
export SLURM_CONF=$conf
# The cluster is up: a slurm test that cannot reach it fails here (under a
# bare ctest it would SKIP with its reason; tests/slurm/lib.sh).
export TRIDENT_SLURM_REQUIRED=1

set +e
ctest --test-dir "$build" --output-on-failure -j "${TRIDENT_CTEST_JOBS:-2}" \
  --output-junit "$build/ctest-times.xml" "$@"
rc=$?
# Each label's time against its budget (tests/time-budget.txt), and the
# slowest tests: printed, never the verdict (these machines are shared).
"$repo/scripts/test-times.py" "$build" || echo "test.sh: see the time budget above" >&2
set -e
exit "$rc"
