#!/usr/bin/env bash
# The CPU attention kernel's forward + backward against one core's sgemm
# rate, by CPU time, for a machine too busy for `trident bench attention`'s
# wall-clock table (issue 28). With two binaries the runs alternate (old,
# new, old, new, ...) and the table gives new/old.
#
#   share/trident/benchmarks/cpu-attention.sh BINARY [NEW_BINARY] [RUNS] [REPS] [SEQ] [HEAD_DIM]
#
# RUNS: runs of each binary (default 3); REPS: forward + backward passes
# timed per run (default 4); SEQ, HEAD_DIM: the causal shape (default 4096,
# 128; one head). CORE (environment, default the last core) is the core
# everything is pinned to, with one BLAS thread.
#
# CPU time of one forward + backward = (CPU time of `trident bench attention
# --reps 1+REPS` - that of `--reps 1`) / REPS: the setup, the spot check and
# the bench's own sgemm (--sgemm-size 64, negligible) cancel. The ceiling is
# a 2048^3 sgemm through the same OpenBLAS by CPU time (best of 3, one per
# run). The bench's own wall-clock table (fwd/sgemm, bwd/sgemm, best of the
# passes) is kept next to it from the longer run; on a loaded machine it is
# noise. FLOPs: 4*D (forward) + 10*D (backward) per visible pair.
set -euo pipefail
old=${1:?usage: cpu-attention.sh BINARY [NEW_BINARY] [RUNS] [REPS] [SEQ] [HEAD_DIM]}
new=${2:-}
runs=${3:-3}
reps=${4:-4}
seq=${5:-4096}
hd=${6:-128}
out=${OUTDIR:-/tmp/trident-cpu-attention}
core=${CORE:-$(($(nproc) - 1))}
source "$(dirname "${BASH_SOURCE[0]}")/cpu-common.sh"
cpu_bench_setup cpu-attention.sh

measure() {
  local bin=$1 log=$2 n
  echo "sgemm_cpu_gflops $(sgemm_cpu)" >"$log.fig"
  for n in 1 $((reps + 1)); do
    /usr/bin/time -f "cpu_s_$n %U %S" -o "$log.time$n" "${pin[@]}" "$bin" bench attention \
      --seq "$seq" --head-dim "$hd" --heads 1 --mask causal --reps "$n" --sgemm-size 64 \
      >"$log.out$n" 2>&1
    awk '{ print $1, $2 + $3 }' "$log.time$n" >>"$log.fig"
  done
  awk '$1 == "causal" { print "wall_fwd_ms", $4; print "wall_fwdbwd_ms", $6 }' \
    "$log.out$((reps + 1))" >>"$log.fig"
}

cpu_bench_alternate

python3 - "$out" "$reps" "$seq" "$hd" "${sides[@]}" <<'PY'
import glob, statistics, sys
out, reps, T, D, sides = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
pairs = T * (T + 1) / 2
fl_fwd, fl_bwd = 4 * D * pairs, 10 * D * pairs
per = {}
for side in sides:
    per[side] = []
    for f in sorted(glob.glob(f"{out}/{side}-*.log.fig")):
        kv = dict(line.split() for line in open(f))
        kv = {k: float(v) for k, v in kv.items()}
        cpu = (kv[f"cpu_s_{reps + 1}"] - kv["cpu_s_1"]) / reps
        per[side].append(dict(cpu=cpu, sg=kv["sgemm_cpu_gflops"], fwd=kv["wall_fwd_ms"] / 1e3,
                              fb=kv["wall_fwdbwd_ms"] / 1e3))
ceil = statistics.median(p["sg"] for s in sides for p in per[s])
print(f"causal attention, seq {T}, head_dim {D}, 1 head; {len(per[sides[0]])} runs per binary, "
      f"{reps} timed passes each; sgemm 2048^3 ceiling {ceil:.1f} GFLOP/s by CPU time "
      f"(median of all runs)\n")
rows = {}
for s in sides:
    med = lambda k: statistics.median(p[k] for p in per[s])
    cpu = med("cpu")
    rows[s] = dict(cpu=cpu * 1e3, gf=(fl_fwd + fl_bwd) / cpu / 1e9,
                   fr=(fl_fwd + fl_bwd) / cpu / 1e9 / ceil,
                   wfwd=med("fwd") * 1e3, wfb=med("fb") * 1e3)
print("| figure (median of runs) | " + " | ".join(sides) + (" | new/old |" if len(sides) > 1 else " |"))
print("|---" * (len(sides) + 1 + (len(sides) > 1)) + "|")
def row(name, key, fmt):
    vals = [rows[s][key] for s in sides]
    extra = [f"{vals[1] / vals[0]:.3f}"] if len(sides) > 1 else []
    print(f"| {name} | " + " | ".join([fmt.format(v) for v in vals] + extra) + " |")
row("fwd+bwd, CPU time (ms)", "cpu", "{:.1f}")
row("fwd+bwd GFLOP/s, CPU time", "gf", "{:.1f}")
row("fwd+bwd / sgemm ceiling, CPU time", "fr", "{:.3f}")
row("fwd, wall, best pass (ms)", "wfwd", "{:.1f}")
row("fwd+bwd, wall, best pass (ms)", "wfb", "{:.1f}")
PY
