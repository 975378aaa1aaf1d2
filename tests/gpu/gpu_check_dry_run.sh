#!/usr/bin/env bash
# CI's run of what the GPU machine will build: scripts/gpu-check.sh --dry-run
# builds tests/gpu standalone with nvcc (as on the GPU machine: CUDA, cmake,
# a compiler and nothing else), checks the verdict logic and the tests'
# timeouts, runs the host checks, expects every device test to SKIP, and
# packs the bundle. No GPU is needed to compile and link.
#
#   gpu_check_dry_run.sh BUILD_DIR
# Exit: gpu-check.sh's (0 pass, 1 fail); 77 (ctest SKIP) without nvcc, with
# the reason on stdout.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:?usage: gpu_check_dry_run.sh BUILD_DIR}
nvcc=$(command -v nvcc || true)
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
if [[ -z $nvcc ]]; then
  echo "SKIP: no nvcc on PATH or in /usr/local/cuda/bin: the standalone GPU build needs the CUDA toolkit"
  exit 77
fi
# A 2-core CI machine builds the kernels for sm_90 in about 4 minutes; the
# script's default build limit (360 s) is sized for the GPU machine.
export PATH=$(dirname "$nvcc"):$PATH
export TRIDENT_GPU_BUILD_TIMEOUT=${TRIDENT_GPU_BUILD_TIMEOUT:-1500}
exec bash "$repo/scripts/gpu-check.sh" --dry-run --no-torch --build-dir "$build" \
  --pack "$build-carry"
