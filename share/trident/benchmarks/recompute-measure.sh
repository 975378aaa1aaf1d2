#!/usr/bin/env bash
# Issue 25's recompute targets, measured side by side with one binary: the
# long-context example's shape scaled to 8 CPU ranks (GQA 8/2 heads, MoE on
# every second layer with the sigmoid_bias router, ring attention cp 2
# zig-zag, interleaved pp 2 x vpp 2, ep 2, dp 2; d_model 128, 8 layers,
# 8 experts top-2, SEQ tokens, 4 micro-batches) under train.recompute = none,
# selective and full. The modes alternate (none, selective, full, none, ...)
# so that a machine whose load drifts affects them alike; the table gives
# the median over RUNS of each mode and the ratio to none:
#   - activations at the peak: /ranks/summary peak_activations_bytes of the
#     rank with the highest allocator peak (what `trident-analyze summary`
#     prints as "peak by kind");
#   - the allocator peak: the largest peak_alloc_bytes over ranks;
#   - step time: the median of /metrics/steps step_time_s after step 0.
# It also checks that every mode's losses and gradient norms equal none's bit
# for bit, and prints the load average before each run.
#
#   share/trident/benchmarks/recompute-measure.sh BINARY [RUNS] [SEQ] [OUTDIR]
#
# RUNS: runs of each mode (default 3). SEQ: data.seq_len (default 2048).
# OUTDIR: run files, logs and the config (default /tmp/trident-recompute).
# Needs mpirun and python3 with h5py and numpy (the project's .venv).
set -euo pipefail
bin=${1:?usage: recompute-measure.sh BINARY [RUNS] [SEQ] [OUTDIR]}
runs=${2:-3}
seq=${3:-2048}
out=${4:-/tmp/trident-recompute}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
python=${TRIDENT_PYTHON:-$repo/.venv/bin/python}
[[ -x $python ]] || python=python3
[[ -x $bin ]] || { echo "recompute-measure.sh: $bin is not an executable" >&2; exit 2; }
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "recompute-measure.sh: RUNS must be a positive integer (got $runs)" >&2; exit 2; }
[[ $seq =~ ^[1-9][0-9]*$ ]] || { echo "recompute-measure.sh: SEQ must be a positive integer (got $seq)" >&2; exit 2; }
mkdir -p "$out"
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ucx
        --mca pml_ucx_devices any --mca pml_ucx_tls any --mca btl '^vader,openib')

cat >"$out/long-context-8.toml" <<TOML
# share/trident/examples/long-context.toml's shape scaled to 8 CPU ranks
[model]
vocab_size = 512
d_model = 128
n_layers = 8
n_heads = 8
n_kv_heads = 2
ffn_hidden = 256
n_experts = 8
top_k = 2
moe_every = 2
router = "sigmoid_bias"

[data]
task = "recall"
seq_len = $seq
micro_batch_size = 1
num_microbatches = 4

[parallel]
pp = 2
vpp = 2
cp = 2
cp_layout = "zigzag"
ep = 2
schedule = "interleaved"

[train]
steps = 3

[runtime]
backend = "cpu"
comm = "mpi"
timeout_s = 1200

[output]
timeline = false

[topology]
nodes = 1
devices_per_node = 8
nvlink_domain = 8
TOML

for ((r = 1; r <= runs; ++r)); do
  for mode in none selective full; do
    echo "== run $r: recompute=$mode, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%H:%M:%S) UTC" >&2
    echo "$(cut -d' ' -f1 /proc/loadavg)" >"$out/$mode-$r.load"
    rm -rf "$out/ck-$mode-$r"
    "${mpirun[@]}" -np 8 "$bin" run "$out/long-context-8.toml" --output "$out/$mode-$r.h5" \
      --set train.recompute="$mode" --set output.checkpoint_dir="$out/ck-$mode-$r" \
      >"$out/$mode-$r.log" 2>&1 || { echo "recompute=$mode run $r failed: see $out/$mode-$r.log" >&2; exit 1; }
    rm -rf "$out/ck-$mode-$r"
  done
done

"$python" - "$out" "$runs" "$seq" <<'PY'
import statistics, sys
import h5py, numpy as np
out, runs, seq = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows, loads, metrics = {}, [], {}
for mode in ("none", "selective", "full"):
    for r in range(1, runs + 1):
        with h5py.File(f"{out}/{mode}-{r}.h5", "r") as f:
            rs, st = f["ranks/summary"][()], f["metrics/steps"][()]
        top = int(np.argmax(rs["peak_alloc_bytes"]))
        rows.setdefault(mode, []).append((rs["peak_activations_bytes"][top] / 2**20,
                                          rs["peak_alloc_bytes"].max() / 2**20,
                                          float(np.median(st["step_time_s"][1:]))))
        metrics.setdefault(mode, []).append({k: st[k].copy() for k in ("loss", "aux_loss", "grad_norm")})
        loads.append(float(open(f"{out}/{mode}-{r}.load").read()))
base = metrics["none"][0]
same = all(np.array_equal(base[k], m[k]) for ms in metrics.values() for m in ms for k in base)
med = {m: [statistics.median(v[i] for v in rows[m]) for i in range(3)] for m in rows}
print(f"seq {seq}, {runs} runs of each mode alternated; load average (1 min) before the runs: "
      f"{min(loads):.1f}-{max(loads):.1f}, median {statistics.median(loads):.1f}")
print(f"losses, aux losses and gradient norms bit-identical to none in every run: {'yes' if same else 'NO'}")
print("| recompute | activations at the peak MiB | x none | allocator peak MiB | x none "
      "| step time s | x none | step times of the runs |")
print("|---|---|---|---|---|---|---|---|")
for m in ("none", "selective", "full"):
    a, p, t = med[m]
    print(f"| {m} | {a:.1f} | x{a / med['none'][0]:.2f} | {p:.1f} | x{p / med['none'][1]:.2f} "
          f"| {t:.2f} | x{t / med['none'][2]:.2f} | {', '.join('%.2f' % v[2] for v in rows[m])} |")
sys.exit(0 if same else 1)
PY
