#!/usr/bin/env bash
# Runs the quickstart on 8 ranks and in its one-rank form (the same global
# batch) with two trident binaries and says whether their step metrics are
# bit-identical: the check for a change that must not move a bit (issue 23's
# reshape). Extra arguments go to both runs (e.g. --set train.precision=bf16).
#
#   scripts/compare-runs.sh OLD_BIN NEW_BIN OUTDIR [--set k=v ...]
# Environment: STEPS (default 10).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
old=$1 new=$2 out=$3
shift 3
mkdir -p "$out"
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ucx
     --mca pml_ucx_devices any --mca pml_ucx_tls any --mca btl '^vader,openib')
cfg=$repo/share/trident/examples/quickstart.toml
one=(--set data.num_microbatches=8 --set parallel.pp=1 --set parallel.cp=1 --set parallel.ep=1
     --set topology.nodes=1 --set topology.devices_per_node=1 --set topology.nvlink_domain=1)
for b in old new; do
  bin=${!b}
  "${mpi[@]}" -np 8 "$bin" run "$cfg" --set train.steps="${STEPS:-10}" \
    --set output.checkpoint_dir="$out/ck-$b-8" "$@" --output "$out/$b-8.h5" >"$out/$b-8.log" 2>&1 ||
    { echo "compare-runs: $b on 8 ranks failed, see $out/$b-8.log" >&2; exit 1; }
  "${mpi[@]}" -np 1 "$bin" run "$cfg" --set train.steps="${STEPS:-10}" "${one[@]}" \
    --set output.checkpoint_dir="$out/ck-$b-1" "$@" --output "$out/$b-1.h5" >"$out/$b-1.log" 2>&1 ||
    { echo "compare-runs: $b on 1 rank failed, see $out/$b-1.log" >&2; exit 1; }
done
"$repo/.venv/bin/python3" - "$out" <<'PY'
import sys
import h5py
import numpy as np
out = sys.argv[1]
same_all = True
for n in ("8", "1"):
    a = h5py.File(f"{out}/old-{n}.h5", "r")["metrics/steps"][:]
    b = h5py.File(f"{out}/new-{n}.h5", "r")["metrics/steps"][:]
    same = len(a) == len(b) and all(np.array_equal(a[k], b[k]) for k in ("loss", "aux_loss", "grad_norm"))
    same_all &= same
    print(f"{n} rank(s): {len(a)}/{len(b)} steps, bit-identical: {same}; "
          f"loss {a['loss'][0]:.4f} -> {a['loss'][-1]:.4f} (old), {b['loss'][0]:.4f} -> {b['loss'][-1]:.4f} (new)")
sys.exit(0 if same_all else 1)
PY
