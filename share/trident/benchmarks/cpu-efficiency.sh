#!/usr/bin/env bash
# The CPU backend's training efficiency: the step of the benchmark model
# (share/trident/examples/cpu-moe-bench.toml, issue 28) on one pinned core
# with one BLAS thread, as a fraction of that core's sgemm rate measured in
# the same session. With two binaries the runs alternate (old, new, old,
# new, ...) so that a machine whose speed drifts affects both alike, and the
# table gives new/old.
#
#   share/trident/benchmarks/cpu-efficiency.sh BINARY [NEW_BINARY] [RUNS] [STEPS] [OUTDIR]
#
# RUNS: runs of each binary (default 3); STEPS: timed steps per run (default
# 6; the wall figure leaves out the steps before FIRST, below); OUTDIR: logs
# (default /tmp/trident-cpu-efficiency).
# CORE (environment, default the last core) is the core everything is pinned to.
# FIRST (environment, default 1) is the first step whose wall time counts:
# issue 28 quotes the median of steps 5-29 of a 30-step run (FIRST=5, STEPS
# 29); the CPU-time figure always spreads steps 1..STEPS.
#
# Two clocks, because a shared machine needs the second:
# - wall: the run's median step time against `trident bench attention`'s
#   sgemm rate (2048^3, best of 3). This is the figure on a quiet machine.
# - cpu: the process's user CPU time per step (that of a run of 1+STEPS
#   steps minus that of a 1-step run, over STEPS) against the CPU time of
#   the same 2048^3 sgemm through OpenBLAS (best of 3). Time slices lost to
#   other processes do not count, so the ratio holds on a busy machine
#   (caches shared with them still cost something). System time is left
#   out: it is almost all the kernel clearing fresh pages for the checkpoint
#   both runs write at their end, which varied by 2 s from run to run on a
#   Zen 5 VM (5.4-7.9 s; cpu-2026-12-04-zen5.md) and made the difference of
#   the two runs meaningless.
# FLOPs per step: trident plan's model formula (3 x forward, causal pairs).
set -euo pipefail
old=${1:?usage: cpu-efficiency.sh BINARY [NEW_BINARY] [RUNS] [STEPS] [OUTDIR]}
new=${2:-}
runs=${3:-3}
steps=${4:-6}
out=${5:-/tmp/trident-cpu-efficiency}
core=${CORE:-$(($(nproc) - 1))}
first=${FIRST:-1}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
config=$repo/share/trident/examples/cpu-moe-bench.toml
[[ -n $new && -x $new ]] && new=$(realpath "$new")
[[ -x $old ]] && old=$(realpath "$old")
source "$repo/share/trident/benchmarks/cpu-common.sh"
cpu_bench_setup cpu-efficiency.sh

# one measurement of BINARY into LOG.fig: "key value" lines
measure() {
  local bin=$1 log=$2 dir=$2.d
  rm -rf "$dir" && mkdir -p "$dir"
  "$bin" bench attention --seq 512 --head-dim 32 --heads 1 --mask causal --reps 3 --threads 1 \
    >"$log.attn" 2>&1
  awk '$1 == "causal" { print "sgemm_wall_gflops", $8 }' "$log.attn" >"$log.fig"
  echo "sgemm_cpu_gflops $(sgemm_cpu)" >>"$log.fig"
  local n
  for n in 1 $((steps + 1)); do
    (cd "$dir" && /usr/bin/time -f "cpu_s_$n %U" -o "$log.time$n" "${pin[@]}" "$bin" run \
       "$config" --set train.steps=$n --set output.file="$dir/run$n.h5" \
       --set output.checkpoint_dir="$dir/ckpt$n" >"$log.run$n" 2>&1)
    cat "$log.time$n" >>"$log.fig"
  done
  # step lines: "step N | loss L | ... | T s | ..."; steps before FIRST warm up
  awk -F'|' -v first="$first" '/^step/ { split($1, s, " "); if (s[2] >= first + 0) { split($6, t, " "); print "step_wall_s", t[1] } }
             /^step/ { split($2, l, " "); loss = l[2] } END { print "last_loss", loss }' \
    "$log.run$((steps + 1))" >>"$log.fig"
}

cpu_bench_alternate

PYTHONPATH="$repo/share/trident/benchmarks${PYTHONPATH:+:$PYTHONPATH}" \
python3 - "$out" "$runs" "$steps" "$config" "$first" "${sides[@]}" <<'PY'
import glob, statistics, sys, tomllib
from model_flops import step_flops
out, runs, steps, config = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
first, sides = int(sys.argv[5]), sys.argv[6:]
cfg = tomllib.load(open(config, "rb"))
dat = cfg["data"]
S = dat["seq_len"]
seqs = dat["micro_batch_size"] * dat["num_microbatches"]
flops = step_flops(cfg["model"], dat)
print(f"model: {flops / (seqs * S) / 1e6:.2f} MFLOP per token, {seqs * S} tokens per step; "
      f"{runs} runs per binary, {steps} timed steps each (wall: median of steps {first}-{steps})\n")
per = {}
for side in sides:
    per[side] = []
    for f in sorted(glob.glob(f"{out}/{side}-*.log.fig")):
        kv = {}
        for line in open(f):
            k, v = line.split()
            kv.setdefault(k, []).append(float(v))
        per[side].append(dict(wall=statistics.median(kv["step_wall_s"]),
                              cpu=(kv[f"cpu_s_{steps + 1}"][0] - kv["cpu_s_1"][0]) / steps,
                              sg_wall=kv["sgemm_wall_gflops"][0], sg_cpu=kv["sgemm_cpu_gflops"][0],
                              loss=kv["last_loss"][0]))
# The ceiling does not depend on the binary: one figure per clock, the median
# of every sgemm measurement of the session.
ceil_wall = statistics.median(p["sg_wall"] for side in sides for p in per[side])
ceil_cpu = statistics.median(p["sg_cpu"] for side in sides for p in per[side])
core = open(f"{out}/blas-core").read().strip()
print(f"sgemm 2048^3 ceiling (median of {sum(len(per[s]) for s in sides)} measurements, OpenBLAS's "
      f"{core} kernels): {ceil_wall:.1f} GFLOP/s by wall clock, {ceil_cpu:.1f} GFLOP/s by CPU time\n")
rows = {}
for side in sides:
    med = lambda k: statistics.median(p[k] for p in per[side])
    rows[side] = dict(wall=med("wall"), cpu=med("cpu"), sg_wall=med("sg_wall"), sg_cpu=med("sg_cpu"),
                      loss=per[side][-1]["loss"], gf_wall=flops / med("wall") / 1e9,
                      gf_cpu=flops / med("cpu") / 1e9)
    rows[side]["fr_wall"] = rows[side]["gf_wall"] / ceil_wall
    rows[side]["fr_cpu"] = rows[side]["gf_cpu"] / ceil_cpu
hdr = "| figure (median of runs) | " + " | ".join(sides) + (" | new/old |" if len(sides) > 1 else " |")
print(hdr)
print("|---" * (len(sides) + 1 + (len(sides) > 1)) + "|")
def row(name, key, fmt, ratio=True):
    vals = [rows[s][key] for s in sides]
    cells = [fmt.format(v) for v in vals]
    extra = [f"{vals[1] / vals[0]:.3f}"] if len(sides) > 1 and ratio else ([""] if len(sides) > 1 else [])
    print(f"| {name} | " + " | ".join(cells + extra) + " |")
row("step, wall (s)", "wall", "{:.3f}")
row("step, CPU time (s)", "cpu", "{:.3f}")
row("sgemm 2048^3, wall (GFLOP/s)", "sg_wall", "{:.1f}")
row("sgemm 2048^3, CPU time (GFLOP/s)", "sg_cpu", "{:.1f}")
row("training GFLOP/s, wall", "gf_wall", "{:.1f}")
row("training GFLOP/s, CPU time", "gf_cpu", "{:.1f}")
row("training / sgemm ceiling, wall", "fr_wall", "{:.3f}")
row("training / sgemm ceiling, CPU time", "fr_cpu", "{:.3f}")
row(f"loss after step {steps}", "loss", "{:.4f}", ratio=False)
PY
