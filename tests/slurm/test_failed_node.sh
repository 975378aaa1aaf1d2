#!/usr/bin/env bash
# slurm/trident.sbatch's failed_node (no cluster needed): which node a failed
# step lost, from the messages of srun and trident in the step's stderr.
# Slurm's "Node failure" first, then the node of trident's first silent rank
# (srun's block layout over the step's nodes in the job's order), then
# srun's first failed task; nothing when no node failed.
set -uo pipefail
template=${TRIDENT_SOURCE_DIR:-$(dirname "$0")/../..}/slurm/trident.sbatch
step_err=$(mktemp)
trap 'rm -f "$step_err"' EXIT
eval "$(sed -n '/^silent_node() {/,/^}/p; /^failed_node() {/,/^}/p' "$template")"
declare -F failed_node >/dev/null && declare -F silent_node >/dev/null ||
  { echo "FAIL: no failed_node/silent_node in $template"; exit 1; }
all_nodes=(n1 n2 n3 n4)
tasks_per_node=4
bad=0
expect() {  # WANT ACTIVE-NODES STDERR-TEXT
  active=($2)
  printf '%b' "$3" >"$step_err"
  local got
  got=$(failed_node)
  if [[ $got == "$1" ]]; then echo "ok: '$got' for: $3"; else echo "FAIL: '$got', want '$1', for: $3"; bad=1; fi
}
hung='trident: error: rank 1: recv from rank 5 timed out; ranks 4, 5, 6, 7 did not answer within 15 s (stopped or dead, or busy outside a wait)\n'
expect n3 "n1 n3" "${hung}srun: error: n1: tasks 0-3: Exited with exit code 1\nsrun: error: n3: tasks 4-7: Killed\n"
expect n2 "n1 n2" "${hung}srun: error: n1: tasks 0-3: Exited with exit code 1\n"
expect n4 "n2 n4" "trident: error: x; rank 7 did not answer within 15 s\nsrun: error: n2: tasks 0-3: Exited with exit code 1\n"
expect n2 "n1 n2" "srun: error: Node failure on n2\nsrun: error: n1: tasks 0-3: Killed\n"
expect n2 "n1 n2" "${hung/ranks 4, 5, 6, 7/ranks 0, 1}srun: error: Node failure on n2\n"
expect n2 "n1 n2" "srun: error: n2: task 5: Killed\nsrun: error: n1: tasks 0-3: Killed\n"
expect "" "n1 n2" "trident: error: stopped: loss not finite; every rank answered a probe (none is stopped or dead)\n"
[[ $bad -eq 0 ]] && echo "PASS: failed_node names the lost node" && exit 0
exit 1
