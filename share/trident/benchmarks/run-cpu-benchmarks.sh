#!/usr/bin/env bash
# The CPU benchmark figures quoted in the issues, in one run, one after the
# other (nothing else should run on the machine). Output: the printed tables
# on stdout and HDF5 files in OUTDIR.
# Usage: share/trident/benchmarks/run-cpu-benchmarks.sh [OUTDIR]   (repo root, after a build)
set -uo pipefail
out=${1:-/tmp/trident-bench}
mkdir -p "$out"
bin=${TRIDENT_BIN:-build/trident}
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca pml ucx --mca pml_ucx_devices any
        --mca pml_ucx_tls any --mca btl ^vader,openib --bind-to none)
run() { echo; echo "\$ $*"; "$@"; }

run "$bin" bench attention --seq 4096 --head-dim 128 --mask full,causal --reps 3 --threads 1 --output "$out/attention.h5"
run "$bin" bench attention --seq 1024,2048,8192 --head-dim 64,128 --mask causal --reps 1 --threads 1 --output "$out/attention-sweep.h5"
run "${mpirun[@]}" -np 2 "$bin" bench ring --causal --baseline --seq-per-rank 2048,4096 --iters 9 --output "$out/ring-cp2.h5"
run "${mpirun[@]}" -np 2 "$bin" bench ring --causal --seq-per-rank 1024,2048,4096,8192 --layout zigzag --iters 1 --output "$out/ring-cp2-memory.h5"
run "${mpirun[@]}" -np 4 "$bin" bench ring --causal --seq-per-rank 1024,2048 --iters 21 --serialize-compute --output "$out/ring-cp4.h5"
run "${mpirun[@]}" -np 8 "$bin" bench ring --causal --seq-per-rank 1024,2048 --iters 21 --serialize-compute --output "$out/ring-cp8.h5"
run "${mpirun[@]}" -np 4 "$bin" bench ring --causal --seq-per-rank 256,1024 --layout zigzag --heads 8 --kv-heads 8 --head-dim 64 --iters 5 --cp-mode ring,ulysses,hybrid --ulysses 2 --output "$out/cp-modes-cp4.h5"
run "${mpirun[@]}" -np 8 "$bin" bench ring --causal --seq-per-rank 256,1024 --layout zigzag --heads 8 --kv-heads 8 --head-dim 64 --iters 5 --cp-mode ring,ulysses,hybrid --ulysses 4 --output "$out/cp-modes-cp8.h5"
for m in 8 16; do
  run "${mpirun[@]}" -np 4 "$bin" bench schedule --schedule all --pp 4 --microbatches $m --vpp 2 --tf 10 --tb 10 --tw 10 --output "$out/schedule-m$m.h5"
done
run "${mpirun[@]}" -np 4 "$bin" bench moe --hidden 1024 --tokens 4096 --experts 8 --top-k 2 --iters 15 --warmup 2 --output "$out/moe.h5"
run "${mpirun[@]}" -np 8 "$bin" bench comm --min-bytes 1K --max-bytes 4M --iters 10 --warmup 2 --output "$out/comm.h5"
