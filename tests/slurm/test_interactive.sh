#!/usr/bin/env bash
# slurm/check-interactive.sh inside an salloc allocation of 2 nodes x 4 tasks:
# its `trident topo` section lists both nodes, and its verdict is that the
# allocation and the mapping are as asked (exit 0).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_cluster
require_h5py

# One attempt (lib.sh, with_stall_retry): the check in an allocation.
attempt() {
  make_workdir "interactive$1"
  write_tiny_config "$WORK/tiny.toml" 2
  out=$WORK/check.out
  cd "$WORK" || fail "cd $WORK"
  TRIDENT_PYTHON=$TRIDENT_PYTHON timeout 240 salloc --job-name=t-interactive --nodes=2 --ntasks-per-node=4 \
    "$TRIDENT_SOURCE_DIR/slurm/check-interactive.sh" "$WORK/tiny.toml" >"$out" 2>&1
  rc=$?
  cat "$out"

  # The topo section: from its header to the next section's, without srun's
  # own lines (which name nodes too).
  grep -q 'PROBLEM: trident topo' "$out" && fail "trident topo failed under srun (see above)"
  topo=$(sed -n '/^---- trident topo ----$/,/^---- smoke run/p' "$out" | grep -Ev '^(srun|salloc|slurmstepd[-a-z0-9]*):' | grep -v '^----')
  [[ -n $topo ]] || fail "no trident topo output"
  for n in n1 n2; do
    grep -qw "$n" <<<"$topo" || fail "trident topo output does not list node $n"
  done
  note "trident topo lists n1 and n2"
  [[ $rc -eq 0 ]] || fail "check-interactive.sh exited $rc (its verdict is above)"
  grep -q 'ALL GOOD' "$out" || fail "check-interactive.sh exited 0 without its ALL GOOD verdict"
  note "PASS"
}

with_stall_retry attempt
