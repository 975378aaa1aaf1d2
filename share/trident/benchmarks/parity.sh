#!/usr/bin/env bash
# Parity figures of the training issue: per-step losses of STEPS steps of the
# quickstart model on 8 ranks (pp=2 cp=2 ep=2 dp=2) and on 4 ranks with each
# parallelism alone, against the one-rank run with the same global batch.
# Usage: share/trident/benchmarks/parity.sh [STEPS] [OUTDIR]   (from the repo root, after a build)
set -euo pipefail
steps=${1:-10}
out=${2:-/tmp/trident-parity}
mkdir -p "$out"
bin=${TRIDENT_BIN:-build/trident}
py=${TRIDENT_PYTHON:-.venv/bin/python3}
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca pml ucx --mca pml_ucx_devices any
        --mca pml_ucx_tls any --mca btl ^vader,openib --bind-to none)
cfg=share/trident/examples/quickstart.toml
common=(--set train.steps=$steps --set output.checkpoint_dir=$out/ckpt)

run() {  # name np sets...
  local name=$1 np=$2; shift 2
  "${mpirun[@]}" -np "$np" "$bin" run "$cfg" "${common[@]}" --set output.checkpoint_dir="$out/ckpt-$name" \
    "$@" --output "$out/$name.h5" > "$out/$name.log" 2>&1 || { echo "run $name failed:"; tail -5 "$out/$name.log"; exit 1; }
}
one_rank=(--set topology.nodes=1 --set topology.devices_per_node=1 --set topology.nvlink_domain=1
          --set parallel.pp=1 --set parallel.cp=1 --set parallel.ep=1)
four=(--set topology.nodes=1 --set topology.devices_per_node=4 --set topology.nvlink_domain=4)

# global batch = micro_batch_size(2) x num_microbatches x dp
run serial16 1 "${one_rank[@]}" --set data.num_microbatches=8
run full8 8                                                     # pp=2 cp=2 ep=2 dp=2, 4 micro-batches
run serial8 1 "${one_rank[@]}" --set data.num_microbatches=4
run pp4 4 "${four[@]}" --set parallel.pp=4 --set parallel.cp=1 --set parallel.ep=1
run cp4 4 "${four[@]}" --set parallel.pp=1 --set parallel.cp=4 --set parallel.ep=1
run serial32 1 "${one_rank[@]}" --set data.num_microbatches=16
run ep4 4 "${four[@]}" --set parallel.pp=1 --set parallel.cp=1 --set parallel.ep=4   # dp=4
run dp4 4 "${four[@]}" --set parallel.pp=1 --set parallel.cp=1 --set parallel.ep=1   # dp=4

for pair in "full8 serial16" "pp4 serial8" "cp4 serial8" "ep4 serial32" "dp4 serial32"; do
  set -- $pair
  echo "== $1 vs $2"
  "$py" -m trident_analyze compare "$out/$1.h5" "$out/$2.h5" --tolerance 1e-4 | tail -2
done
