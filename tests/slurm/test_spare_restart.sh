#!/usr/bin/env bash
# A lost node inside the allocation (TRIDENT_SPARE_NODES): a 2-node job with
# one spare (3 nodes allocated) whose ranks on one node are SIGKILLed mid-run
# goes on in the same allocation, on the spare, from the newest checkpoint:
# one job, no requeue, and the same losses and final checkpoint as an
# uninterrupted job, bit for bit. The restarted step's run file holds a
# `restart` event naming the node left out. The restart resumes from the
# node-local tier, n2's shards coming from their partner copies on n1, and
# the event says so; the template removes the tier at the end (spare_lib.sh).
# test_spare_slurmd.sh loses the node by stopping its slurmd instead.
# Needs a cluster of 3 nodes (SKIP with the reason on a smaller one).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/spare_lib.sh"
require_spare_cluster
steps=${TRIDENT_SPARE_STEPS:-12}

attempt() {
  trap spare_cleanup EXIT
  start_spare_pair "$1" "$steps"
  victims=$(pids_on "$JID" n2)
  [[ -n $victims ]] || { show_log "$LOG"; fail "no trident process of job $JID on n2"; }
  kill -KILL $victims
  note "SIGKILLed the ranks of job $JID on n2 (pids $(echo $victims)) after $(steps_logged "$LOG") steps"
  check_spare_pair "$steps"
}

with_stall_retry attempt
echo "PASS: a node lost inside the allocation: restarted on the spare, bit for bit"
