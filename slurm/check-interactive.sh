#!/usr/bin/env bash
# Interactive check of a Slurm allocation before a long run: does every node
# answer, what does trident see (`trident topo` over the whole allocation),
# does a two-step smoke run work, and is the rank mapping what was asked for?
# Ends with one plain-words verdict; exit 0 only if everything held.
#
#   salloc --nodes=2 --ntasks-per-node=4 [--gpus-per-node=4]
#   slurm/check-interactive.sh [CONFIG.toml] [--set section.key=value ...]
#   # or in one go: salloc -N2 --ntasks-per-node=4 slurm/check-interactive.sh
#
# Without CONFIG a tiny model is used, with pp = the number of nodes (so that
# the stage placement is checked) and cp = 2 where the ranks per node allow.
# Environment: TRIDENT_BIN, TRIDENT_PYTHON (python3 with h5py), TRIDENT_SRUN_ARGS.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

say() { echo "check-interactive: $*"; }
if [[ -z ${SLURM_JOB_ID:-} ]]; then
  say "not inside a Slurm allocation: start one first, e.g. salloc --nodes=2 --ntasks-per-node=4"
  exit 2
fi

bin=${TRIDENT_BIN:-}
if [[ -z $bin ]]; then
  if command -v trident >/dev/null; then bin=$(command -v trident); else bin=$repo/build/trident; fi
fi
[[ -x $bin ]] || { say "trident executable not found ($bin): set TRIDENT_BIN"; exit 2; }
py=${TRIDENT_PYTHON:-}
if [[ -z $py ]]; then
  if [[ -x $repo/.venv/bin/python3 ]]; then py=$repo/.venv/bin/python3; else py=python3; fi
fi

# Same MPI defaults as trident.sbatch (UCX on any device, no vader).
export OMPI_MCA_pml=${OMPI_MCA_pml:-ucx}
export OMPI_MCA_pml_ucx_devices=${OMPI_MCA_pml_ucx_devices:-any}
export OMPI_MCA_pml_ucx_tls=${OMPI_MCA_pml_ucx_tls:-any}
export OMPI_MCA_btl=${OMPI_MCA_btl:-^vader,openib}

nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
ntasks=${SLURM_NTASKS:-$nodes}
tpn=${SLURM_NTASKS_PER_NODE:-$((ntasks / nodes))}
node_names=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null | paste -sd, -)
say "allocation $SLURM_JOB_ID asks for $nodes node(s) ($node_names), $tpn task(s) per node, $ntasks in all, GPUs per node: ${SLURM_GPUS_PER_NODE:-none}"

work=$(mktemp -d "${TMPDIR:-/tmp}/trident-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

config=
if [[ $# -gt 0 && $1 != -* ]]; then
  config=$1
  shift
fi
if [[ -z $config ]]; then
  cp=1
  [[ $((tpn % 2)) -eq 0 ]] && cp=2
  config=$work/smoke.toml
  cat >"$config" <<EOF
# check-interactive.sh's tiny model: one stage per node, cp=$cp.
[model]
vocab_size = 32
d_model = 32
n_layers = $((2 * nodes))
n_heads = 2
n_kv_heads = 2
ffn_hidden = 64
n_experts = 0
[data]
seq_len = 32
micro_batch_size = 1
num_microbatches = $((2 * nodes))
[parallel]
pp = $nodes
cp = $cp
[train]
steps = 2
warmup_steps = 1
[runtime]
timeout_s = 60
EOF
fi
overrides=("$@")

failures=()

# 1. Every node answers.
echo "---- nodes ----"
answered=$(srun --ntasks-per-node=1 --ntasks="$nodes" bash -c 'echo "$SLURMD_NODENAME"' 2>&1 | sort -u)
echo "$answered"
for n in ${node_names//,/ }; do
  grep -qx "$n" <<<"$answered" || failures+=("node $n did not answer")
done

# 2. trident topo over the whole allocation.
echo "---- trident topo ----"
# shellcheck disable=SC2086
topo_out=$(srun --mpi=pmix --kill-on-bad-exit=1 ${TRIDENT_SRUN_ARGS:-} "$bin" topo "$config" \
  ${overrides[@]+"${overrides[@]}"} 2>&1)
topo_rc=$?
echo "$topo_out"
if [[ $topo_rc -ne 0 ]]; then
  failures+=("trident topo failed (exit $topo_rc)")
else
  for n in ${node_names//,/ }; do
    grep -Ev '^(srun|salloc|slurmstepd[-a-z0-9]*):' <<<"$topo_out" | grep -qw "$n" || failures+=("trident topo does not list node $n")
  done
fi

# 3. A two-step smoke run whose run file holds the mapping trident used.
echo "---- smoke run (2 steps) ----"
# shellcheck disable=SC2086
srun --mpi=pmix --kill-on-bad-exit=1 ${TRIDENT_SRUN_ARGS:-} "$bin" run "$config" \
  ${overrides[@]+"${overrides[@]}"} --set train.steps=2 --set output.checkpoint_every=0 \
  --set "output.checkpoint_dir=\"$work/checkpoints\"" --output "$work/smoke.h5" >"$work/smoke.out" 2>&1
run_rc=$?
# trident's own lines first (the launcher's and MPI's noise can outnumber
# them), then the last few of the rest
grep -E '^trident: (error|warning):' "$work/smoke.out"
grep -vE '^trident: (error|warning):' "$work/smoke.out" | tail -n 5
if [[ $run_rc -ne 0 ]]; then
  failures+=("the smoke run failed (exit $run_rc)")
fi

# 4. The mapping, from the run file.
echo "---- mapping ----"
if [[ -f $work/smoke.h5 ]]; then
  "$py" "$here/check_mapping.py" "$work/smoke.h5" --nodes "$nodes" --ranks-per-node "$tpn" \
    --node-names "$node_names" --job-id "$SLURM_JOB_ID"
  map_rc=$?
  [[ $map_rc -eq 0 ]] || failures+=("the rank mapping is not what was asked (see above)")
else
  failures+=("no run file from the smoke run, so the mapping could not be checked")
fi

echo "---- verdict ----"
if [[ ${#failures[@]} -eq 0 ]]; then
  say "ALL GOOD: $nodes node(s) x $tpn rank(s) answered, trident sees them as asked, and a smoke run trained 2 steps."
  exit 0
fi
for f in "${failures[@]}"; do say "PROBLEM: $f"; done
say "NOT READY: fix the problems above before a long run."
exit 1
