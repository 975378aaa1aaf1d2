#!/usr/bin/env bash
# Two trident binaries measured side by side on the figures that guard
# against slowdowns: the quickstart's tokens/s (and its metrics, which must be
# bit-identical unless the order of arithmetic changed), bench attention,
# bench ring --baseline and bench moe. Runs alternate (old, new, old, new, ...)
# so that a machine whose speed drifts affects both alike; the table gives
# medians and new/old. Nothing else should run on the machine.
#
#   share/trident/benchmarks/side-by-side.sh OLD_BINARY NEW_BINARY [RUNS] [OUTDIR]
#
# RUNS: runs of each binary per benchmark (default 3). OUTDIR: logs and run
# files (default /tmp/trident-side-by-side). BENCHES (environment): which of
# "quickstart attention ring moe" to run (default all four). Needs mpirun
# and python3 with h5py and numpy for the metrics comparison (the project's
# .venv has them).
set -euo pipefail
old=${1:?usage: side-by-side.sh OLD_BINARY NEW_BINARY [RUNS] [OUTDIR]}
new=${2:?usage: side-by-side.sh OLD_BINARY NEW_BINARY [RUNS] [OUTDIR]}
runs=${3:-3}
out=${4:-/tmp/trident-side-by-side}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
python=${TRIDENT_PYTHON:-$repo/.venv/bin/python}
[[ -x $python ]] || python=python3
for b in "$old" "$new"; do
  [[ -x $b ]] || { echo "side-by-side.sh: $b is not an executable" >&2; exit 2; }
done
mkdir -p "$out"
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ucx
        --mca pml_ucx_devices any --mca pml_ucx_tls any --mca btl '^vader,openib')

# bench_<name> BINARY LOG: one run, its figures as "key value" lines in LOG.fig
bench_quickstart() {
  local dir=$2.d
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && "${mpirun[@]}" -np 8 "$1" run "$repo/share/trident/examples/quickstart.toml" \
     --set output.file="$dir/run.h5" --set output.checkpoint_dir="$dir/ckpt" >"$2" 2>&1)
  awk '/^done:/ { for (i = 1; i <= NF; ++i) if ($(i) ~ /^tokens\/s/) print "quickstart_tokens_per_s", $(i-1) }' \
    "$2" | tr -d ',' >"$2.fig"
}
bench_attention() {
  "$1" bench attention --seq 4096 --head-dim 128 --mask full,causal --reps 3 --threads 1 >"$2" 2>&1
  awk '$1 == "full" || $1 == "causal" { print "attention_" $1 "_fwd_ms", $4; print "attention_" $1 "_fwdbwd_ms", $6 }' \
    "$2" >"$2.fig"
}
bench_ring() {
  "${mpirun[@]}" -np 2 "$1" bench ring --baseline --causal --seq-per-rank 2048 --iters 5 \
    --layout both >"$2" 2>&1
  # the per-case table: wall_ms is column 9
  awk '/^# Ring attention per case/ { t = 1 } t && ($1 == "contiguous" || $1 == "zigzag") && NF >= 14 { print "ring_" $1 "_wall_ms", $9 }
       /^# Ring attention steps/ { t = 0 }' "$2" >"$2.fig"
}
bench_moe() {
  "${mpirun[@]}" -np 4 "$1" bench moe --hidden 1024 --tokens 4096 --experts 8 --top-k 2 --iters 15 \
    --warmup 2 >"$2" 2>&1
  awk '/^# MoE dispatch/ { t = 1 } t && ($1 == "balanced" || $1 == "skewed") { print "moe_" $1 "_" $2 "_dispatch_plus_combine_ms", $5 + $6 }
       /^# dispatch =/ { t = 0 }' "$2" >"$2.fig"
}

for name in ${BENCHES:-quickstart attention ring moe}; do
  for ((r = 1; r <= runs; ++r)); do
    for side in old new; do
      bin=$old
      [[ $side == new ]] && bin=$new
      echo "== $name run $r: $side" >&2
      "bench_$name" "$bin" "$out/$name-$side-$r.log"
    done
  done
done

"$python" - "$out" "$runs" <<'PY'
import glob, statistics, sys, os
out, runs = sys.argv[1], int(sys.argv[2])
figs = {}
for side in ("old", "new"):
    for f in glob.glob(f"{out}/*-{side}-*.log.fig"):
        for line in open(f):
            k, v = line.split()
            figs.setdefault((k, side), []).append(float(v))
keys = sorted({k for k, _ in figs})
print(f"| figure (median of {runs} runs) | old | new | new/old |")
print("|---|---|---|---|")
for k in keys:
    o, n = figs.get((k, "old"), []), figs.get((k, "new"), [])
    if not o or not n:
        print(f"| {k} | {o} | {n} | missing |"); continue
    mo, mn = statistics.median(o), statistics.median(n)
    print(f"| {k} | {mo:.4g} | {mn:.4g} | {mn / mo:.3f} |")
try:
    import h5py, numpy as np
    a = h5py.File(f"{out}/quickstart-old-1.log.d/run.h5")["metrics/steps"][()]
    b = h5py.File(f"{out}/quickstart-new-1.log.d/run.h5")["metrics/steps"][()]
    for f in ("loss", "aux_loss", "z_loss", "grad_norm", "lr"):
        if f in a.dtype.names and f in b.dtype.names:
            same = np.array_equal(a[f], b[f])
            print(f"quickstart /metrics/steps {f}: " + ("bit-identical" if same else
                  f"max |diff| {np.max(np.abs(a[f] - b[f])):.3g}"))
    print(f"quickstart loss: {a['loss'][0]:.4f} -> {a['loss'][-1]:.4f} (old), "
          f"{b['loss'][0]:.4f} -> {b['loss'][-1]:.4f} (new)")
except Exception as e:  # the table above stands on its own
    print(f"metrics comparison skipped: {e}")
PY
