#!/usr/bin/env bash
# Native bf16 on the CPU (issue 48): the training step of a benchmark model
# in fp32, in bf16 on the staged path (TRIDENT_CPU_BF16=staged) and in bf16
# on the native path (TRIDENT_CPU_BF16=native, AVX512-BF16), by the
# process's user CPU time on one pinned core with one BLAS thread, the three
# alternating run by run; with TORCH (a python that imports torch, e.g.
# /tmp/torchenv/bin/torchpy from /work/shared/tools/torch-env.sh) PyTorch
# eager's fp32 and autocast-bf16 step of the same model on the same core
# (torch-moe-bench.py) beside them.
# `trident bench step CONFIG --precision fp32,bf16` measures the same in one
# process (the variants alternating step by step, a table and an HDF5 bench
# file; staged and native there are two runs, TRIDENT_CPU_BF16 being a
# process setting): cpu-2026-12-05-bf16.md, "The same through trident bench".
#
#   share/trident/benchmarks/cpu-bf16.sh BINARY [CONFIG] [RUNS] [STEPS] [OUTDIR]
#
# CONFIG: default share/trident/examples/cpu-dense-bench.toml (every GEMM
# bf16 under train.precision = "bf16"); RUNS: runs per variant (default 2);
# STEPS: timed steps per run (default 4): CPU time per step = (that of a
# 1+STEPS-step run - that of a 1-step run) / STEPS, as cpu-efficiency.sh;
# OUTDIR: logs (default /tmp/trident-cpu-bf16). CORE (environment, default
# the last core) is the core everything is pinned to.
set -euo pipefail
bin=${1:?usage: cpu-bf16.sh BINARY [CONFIG] [RUNS] [STEPS] [OUTDIR]}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
config=${2:-$repo/share/trident/examples/cpu-dense-bench.toml}
runs=${3:-2}
steps=${4:-4}
out=${5:-/tmp/trident-cpu-bf16}
core=${CORE:-$(($(nproc) - 1))}
[[ -x $bin ]] || { echo "cpu-bf16.sh: $bin is not an executable" >&2; exit 2; }
[[ -f $config ]] || { echo "cpu-bf16.sh: no config $config" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "cpu-bf16.sh: needs /usr/bin/time (Debian: time)" >&2; exit 2; }
bin=$(realpath "$bin")
config=$(realpath "$config")
mkdir -p "$out"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
pin=(taskset -c "$core")
cpu_model=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
blas=$(python3 -c 'import ctypes; b = ctypes.CDLL("libopenblas.so.0"); b.openblas_get_corename.restype = ctypes.c_char_p; print(b.openblas_get_corename().decode())')
units=$(grep -o -w -E 'avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
echo "cpu-bf16.sh: $cpu_model, core $core; OpenBLAS kernels $blas${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}; bf16 units: ${units:-none}" | tee "$out/host"

# variant NAME -> the precision and TRIDENT_CPU_BF16 of its runs
declare -A precision=([fp32]=fp32 [bf16_staged]=bf16 [bf16_native]=bf16)
declare -A mode=([fp32]=auto [bf16_staged]=staged [bf16_native]=native)
variants=(fp32 bf16_staged bf16_native)

# one measurement: user CPU seconds of a run of N steps into LOG
run_steps() {
  local v=$1 n=$2 log=$3 dir=$3.d
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && TRIDENT_CPU_BF16=${mode[$v]} /usr/bin/time -f "%U" -o "$log.cpu" "${pin[@]}" \
     "$bin" run "$config" --set train.steps="$n" --set train.precision="${precision[$v]}" \
     --set output.file="$dir/run.h5" --set output.checkpoint_dir="$dir/ckpt" >"$log" 2>&1)
  rm -rf "$dir"
}

for ((r = 1; r <= runs; ++r)); do
  for v in "${variants[@]}"; do
    echo "== run $r: $v, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    run_steps "$v" 1 "$out/$v-$r-1.log"
    run_steps "$v" $((steps + 1)) "$out/$v-$r-n.log"
  done
done

if [[ -n ${TORCH:-} ]]; then
  for p in fp32 bf16; do
    echo "== torch $p" >&2
    "${pin[@]}" "$TORCH" "$repo/share/trident/benchmarks/torch-moe-bench.py" --config "$config" \
      --steps $((steps + 2)) --first 2 --precision "$p" >"$out/torch-$p.log" 2>&1 ||
      echo "cpu-bf16.sh: torch $p failed (see $out/torch-$p.log)" >&2
  done
fi

PYTHONPATH="$repo/share/trident/benchmarks${PYTHONPATH:+:$PYTHONPATH}" \
python3 - "$out" "$runs" "$steps" "$config" "${variants[@]}" <<'PY'
import glob, re, statistics, sys, tomllib
out, runs, steps, config, variants = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
from model_flops import step_flops
cfg = tomllib.load(open(config, "rb"))
flops = step_flops(cfg["model"], cfg["data"])
def cpu(path):
    return float(open(path).read().split()[-1])
def loss(path):
    last = None
    for line in open(path):
        mm = re.match(r"step\s+\d+\s*\|\s*loss\s+([0-9.]+)", line)
        if mm: last = float(mm.group(1))
    return last
print(open(f"{out}/host").read().strip())
print(f"model {config.rsplit('/', 1)[-1]}: {flops / 1e9:.1f} GFLOP per step; {runs} runs per variant, "
      f"{steps} timed steps each (CPU time per step, median of runs)\n")
print("| variant | step CPU time (s) | GFLOP/s | vs fp32 | loss after step " + str(steps + 1) + " |")
print("|---|---|---|---|---|")
base = None
for v in variants:
    per = [(cpu(f"{out}/{v}-{r}-n.log.cpu") - cpu(f"{out}/{v}-{r}-1.log.cpu")) / steps
           for r in range(1, runs + 1)]
    t = statistics.median(per)
    base = base or t
    print(f"| trident {v} | {t:.3f} | {flops / t / 1e9:.1f} | {base / t:.2f}x | "
          f"{loss(f'{out}/{v}-{runs}-n.log')} |")
for p in ("fp32", "bf16"):
    try:
        text = open(f"{out}/torch-{p}.log").read()
    except OSError:
        continue
    mm = re.search(r"cpu ([0-9.]+) s \(steps", text)
    if mm:
        t = float(mm.group(1))
        print(f"| PyTorch eager {p} | {t:.3f} | {flops / t / 1e9:.1f} | {base / t:.2f}x | |")
PY
