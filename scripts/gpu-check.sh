#!/usr/bin/env bash
# The GPU check: on a machine with one CUDA GPU and only the CUDA toolkit,
# cmake, ninja (or make), a C++ compiler and (optionally) PyTorch, builds the
# CUDA kernels, the CPU reference kernels, tests/gpu and the attention
# benchmark from this source tree alone (cmake -S tests/gpu), runs the tests,
# and prints the benchmark table next to the cuBLAS GEMM rate and PyTorch's
# SDPA. Budget: under 8 minutes on an H200 (each step has its own timeout).
#
#   scripts/gpu-check.sh [--dry-run] [--build-dir DIR] [--arch SM] [--no-torch]
#
#   --dry-run     for a machine without a GPU: the same configure and build,
#                 and the tests must all report SKIP (exit 77) instead of
#                 passing; the benchmark and the PyTorch script must SKIP too.
#   --build-dir   default build-gpu (relative to the repository root)
#   --arch        CMAKE_CUDA_ARCHITECTURES, default 90 (H100/H200); "80;90" in CI
#   --no-torch    leave out the PyTorch column
#
# Environment: TRIDENT_CUDA_ARCH (default of --arch), TRIDENT_GPU_BUILD_TIMEOUT
# (seconds for the build step, default 360; a 2-core CPU machine needs more).
#
# Exit 0: everything built and every test passed (with --dry-run: built and
# every test skipped); 1: a step failed (the summary names it); 2: bad flag.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dry_run=0
build=build-gpu
arch=${TRIDENT_CUDA_ARCH:-90}
torch=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --build-dir) build=${2:?--build-dir needs a value}; shift ;;
    --arch) arch=${2:?--arch needs a value}; shift ;;
    --no-torch) torch=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[[ $build = /* ]] || build=$repo/$build
t_start=$SECONDS
summary=()
failed=0
note() { summary+=("$1"); echo "== $1"; }
fail() { note "FAIL: $1"; failed=1; }

# Runs "$@" with a limit of $1 seconds, output to the terminal and $log.
step() {
  local limit=$1; shift
  timeout --signal=TERM --kill-after=10 "$limit" "$@"
}

echo "== gpu-check: $(date -u +%FT%TZ) on $(hostname), repository $repo"
[[ $dry_run = 1 ]] && echo "== DRY RUN: nothing here runs on a GPU"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [[ ! -x $nvcc ]]; then
  echo "gpu-check.sh: no nvcc on PATH or in /usr/local/cuda/bin" >&2
  exit 1
fi
"$nvcc" --version | tail -1
cmake --version | head -1
generator=(-G Ninja)
command -v ninja >/dev/null || generator=(-G "Unix Makefiles")
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi: not found"
fi

# ---- configure and build (kernels, reference kernels, tests, benchmark) ----
mkdir -p "$build"
if step 120 cmake -S "$repo/tests/gpu" -B "$build" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" > "$build/configure.log" 2>&1; then
  note "configure: ok (CUDA architectures $arch)"
else
  cat "$build/configure.log"
  fail "configure (log above)"
fi
if [[ $failed = 0 ]]; then
  build_limit=${TRIDENT_GPU_BUILD_TIMEOUT:-360}
  step "$build_limit" cmake --build "$build" -j "$(nproc)"
  rc=$?
  if [[ $rc = 0 ]]; then
    note "build: ok ($((SECONDS - t_start)) s so far)"
  elif [[ $rc = 124 ]]; then
    fail "build: not done after $build_limit s (TRIDENT_GPU_BUILD_TIMEOUT)"
  else
    fail "build"
  fi
fi

# ---- tests ----
if [[ $failed = 0 ]]; then
  ctest_log=$build/ctest.log
  (cd "$build" && step 240 ctest -L gpu --output-on-failure -j1) 2>&1 | tee "$ctest_log"
  total=$(grep -cE '^ *[0-9]+/[0-9]+ Test' "$ctest_log")
  passed=$(grep -cE '^ *[0-9]+/[0-9]+ Test.* Passed' "$ctest_log")
  skipped=$(grep -cE '^ *[0-9]+/[0-9]+ Test.*Skipped' "$ctest_log")
  bad=$((total - passed - skipped))
  if [[ $total = 0 ]]; then
    fail "tests: none ran"
  elif [[ $dry_run = 1 ]]; then
    if [[ $skipped = "$total" ]]; then
      note "tests: all $total reported SKIP (no device), as a dry run expects"
    else
      fail "tests: $passed passed, $bad failed, $skipped skipped of $total; a dry run expects all to SKIP"
    fi
  elif [[ $passed = "$total" ]]; then
    note "tests: all $total passed"
  else
    fail "tests: $passed passed, $bad failed, $skipped skipped of $total (a skip on a GPU machine is a failure)"
  fi
fi

# ---- benchmark: PyTorch SDPA first (its numbers go into the table) ----
# Runs whenever the build succeeded, also after a failed test: the figures
# are worth having from a scarce GPU session (the summary still says FAIL).
if [[ -x $build/trident_gpu_bench ]]; then
  torch_file=$build/torch-sdpa.txt
  : > "$torch_file"
  if [[ $torch = 1 ]]; then
    step 150 python3 "$repo/tests/gpu/bench/sdpa_bench.py" > "$torch_file"
    rc=$?
    case $rc in
      0) note "torch SDPA: measured ($(wc -l < "$torch_file") rows)" ;;
      77) note "torch SDPA: skipped (see the SKIP line above)" ;;
      *) note "torch SDPA: failed (exit $rc); the table has no torch column" ;;
    esac
  fi
  step 200 "$build/trident_gpu_bench" --torch "$torch_file"
  rc=$?
  case $rc in
    0) note "benchmark: table above" ;;
    77) if [[ $dry_run = 1 ]]; then note "benchmark: SKIP (no device), as a dry run expects"
        else fail "benchmark: SKIP on a GPU machine"; fi ;;
    *) fail "benchmark (exit $rc)" ;;
  esac
fi

echo
echo "==== gpu-check summary ($((SECONDS - t_start)) s) ===="
for line in "${summary[@]}"; do echo "  $line"; done
echo "  not part of this check: the 1-rank GPU-vs-CPU training run (needs the training"
echo "  loop's CUDA backend and the full build: MPI, HDF5, TOML++)"
[[ $dry_run = 1 ]] && echo "  DRY RUN: nothing ran on a GPU"
if [[ $failed = 0 ]]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
exit $failed
