#!/usr/bin/env bash
# Every figure issue 48 asks for, per host, in one command (nothing else
# should run on the machine; about 15-25 minutes on one core):
#
#   share/trident/benchmarks/cpu-host-report.sh BINARY [OUTDIR]
#
# 1. the host: CPU model, AVX-512 / AVX512-BF16 / AMX flags, cache sizes,
#    OpenBLAS's kernels;
# 2. fp32 training against the core's sgemm ceiling (cpu-efficiency.sh, the
#    MoE benchmark model) and attention forward + backward against it
#    (cpu-attention.sh, seq 4096, head_dim 128, causal);
# 3. `trident bench gemm` (bf16 against f32 on the dense model's linear
#    layers; where the binary has it, the block-size sweep);
# 4. the training step in fp32, bf16 staged and bf16 native, dense and MoE
#    benchmark models (cpu-bf16.sh, by user CPU time; with TORCH, PyTorch
#    eager fp32 and autocast-bf16 beside them), and the same through
#    `trident bench step` (the variants alternating in one process);
# 5. with TORCH (a python that imports torch: /work/shared/tools/torch-env.sh),
#    attention against PyTorch's SDPA in fp32 and bf16 (torch-attention-bench.py
#    beside `trident bench attention --dtype f32,bf16`).
#
# Everything is pinned to one core (CORE, default the last) with one BLAS
# thread. The logs and HDF5 files go to OUTDIR (default
# /tmp/trident-host-report); OUTDIR/summary.md gathers the tables, to paste
# into a dated note in share/trident/benchmarks/ with the date and commit.
set -uo pipefail
bin=${1:?usage: cpu-host-report.sh BINARY [OUTDIR]}
out=${2:-/tmp/trident-host-report}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
[[ -x $bin ]] || { echo "cpu-host-report.sh: $bin is not an executable" >&2; exit 2; }
bin=$(realpath "$bin")
mkdir -p "$out" || { echo "cpu-host-report.sh: cannot make $out" >&2; exit 2; }
export CORE=${CORE:-$(($(nproc) - 1))} OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
pin=(taskset -c "$CORE")
dense=$repo/share/trident/examples/cpu-dense-bench.toml
moe=$repo/share/trident/examples/cpu-moe-bench.toml
summary=$out/summary.md
failed=0

# section TITLE COMMAND...: the command's output into the summary under TITLE
section() {
  local title=$1
  shift
  echo "== $title ($(date -u +%H:%M) UTC, load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
  { echo; echo "## $title"; echo; echo '```'; echo "\$ $*"; } >>"$summary"
  if ! "$@" >>"$summary" 2>"$out/last.err"; then
    failed=1
    { echo "(failed; stderr:)"; tail -5 "$out/last.err"; } >>"$summary"
  fi
  echo '```' >>"$summary"
}

host_facts() {
  awk -F': ' '/^model name/ { print "cpu: " $2; exit }' /proc/cpuinfo
  echo "flags: $(grep -o -w -E 'avx512f|avx512_bf16|amx_tile|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  local d
  for d in /sys/devices/system/cpu/cpu"$CORE"/cache/index*; do
    [[ -r $d/size ]] && echo "cache L$(cat "$d/level") $(cat "$d/type"): $(cat "$d/size")"
  done
  python3 -c 'import ctypes; b = ctypes.CDLL("libopenblas.so.0"); b.openblas_get_corename.restype = ctypes.c_char_p; print("openblas kernels:", b.openblas_get_corename().decode())'
  echo "binary: $bin (${TRIDENT_COMMIT:-commit not given})"
}

torch_attention() {
  "${pin[@]}" "$TORCH" "$here/torch-attention-bench.py" --seq 2048 --head-dim 128 --mask causal \
    --reps 3 --bench-h5 "$out/attention-dtype.h5"
}

: >"$summary"
echo "# issue 48 host report, $(date -u +%Y-%m-%d)" >>"$summary"
section "host" host_facts
section "fp32 step against sgemm (MoE benchmark model)" \
  "$here/cpu-efficiency.sh" "$bin" "" 2 4 "$out/efficiency"
section "attention fwd+bwd against sgemm (seq 4096, D 128, causal)" \
  "$here/cpu-attention.sh" "$bin" "" 2 2 4096 128
section "bench gemm" "${pin[@]}" "$bin" bench gemm "$dense" --output "$out/gemm.h5"
if "$bin" bench gemm --help 2>/dev/null | grep -q -- --sweep; then
  section "bench gemm --sweep" "${pin[@]}" "$bin" bench gemm "$dense" --sweep --output "$out/gemm-sweep.h5"
fi
section "step: dense (cpu-bf16.sh)" "$here/cpu-bf16.sh" "$bin" "$dense" 2 4 "$out/bf16-dense"
section "step: MoE (cpu-bf16.sh)" "$here/cpu-bf16.sh" "$bin" "$moe" 2 4 "$out/bf16-moe"
for cfg in "$dense" "$moe"; do
  section "bench step $(basename "$cfg")" "${pin[@]}" "$bin" bench step "$cfg" \
    --precision fp32,bf16_staged,bf16_native --steps 6 --output "$out/step-$(basename "$cfg" .toml).h5"
done
section "bench attention --dtype f32,bf16 (seq 2048, D 128, causal)" "${pin[@]}" "$bin" bench attention \
  --seq 2048 --head-dim 128 --mask causal --dtype f32,bf16 --reps 3 --threads 1 \
  --output "$out/attention-dtype.h5"
if [[ -n ${TORCH:-} ]]; then
  section "PyTorch SDPA (same shape)" torch_attention
else
  echo >>"$summary"
  echo "PyTorch SDPA: not run (TORCH unset: source /work/shared/tools/torch-env.sh and set TORCH)" >>"$summary"
fi
echo "cpu-host-report.sh: $summary" >&2
exit $failed
