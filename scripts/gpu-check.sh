#!/usr/bin/env bash
# The GPU check: on a machine with one CUDA GPU and only the CUDA toolkit,
# cmake, ninja (or make), a C++ compiler and (optionally) PyTorch, builds the
# CUDA kernels, the CPU reference kernels, tests/gpu and the attention
# benchmark from this source tree alone (cmake -S tests/gpu), or takes them
# from a bundle a CPU machine packed (--prebuilt), runs the tests, and prints
# the benchmark table next to the cuBLAS GEMM rate and PyTorch's SDPA.
# Budget: under 8 minutes on an H200 (each step has its own time limit).
#
#   scripts/gpu-check.sh [--dry-run] [--prebuilt DIR] [--pack DIR] [--build-dir DIR]
#                        [--arch SM] [--no-torch] [--trident BIN [--mpirun CMD]]
#                        [--train-bundle ARCHIVE]
#
#   --dry-run     for a machine without a GPU: checks this script's verdict
#                 logic (tests/unit/scripts/test_gpu_check_verdict.sh), the
#                 same configure and build, that every test's timeout is under
#                 the test step's limit, that the tests all report SKIP (exit
#                 77) and the benchmark too, and packs the bundle (--pack)
#   --pack        where --dry-run packs the bundle for the GPU machine
#                 (default build-gpu-carry): the stripped test binaries, the
#                 benchmark, the test list with timeouts, the C++ runtime
#                 they were linked against, and a manifest; at most 60 MiB
#   --prebuilt    on the GPU machine: run the bundle's binaries instead of
#                 building (saves the build's minutes of device time). If they
#                 do not start there (loader, C++ runtime), or the bundle was
#                 packed from another commit, the check builds from source.
#   --build-dir   default build-gpu (relative to the repository root)
#   --arch        CMAKE_CUDA_ARCHITECTURES, default 90 (H100/H200); "80;90" in CI
#   --no-torch    leave out the PyTorch column
#   --trident     also train: scripts/gpu-train-check.py with this trident
#                 binary (a full build: MPI, HDF5, the CUDA backend): 1 rank
#                 fp32 on the GPU against the CPU (1e-4), bf16 against fp32,
#                 4 ranks sharing the GPU through MPI staging against 1 rank,
#                 tokens/s and MFU of a larger bf16 model. With --dry-run the
#                 same runs go to the emulated device. Without it the check
#                 says the training part was not run (the project's GPU
#                 machine has no MPI or HDF5).
#   --mpirun      the launcher for --trident (default: mpirun as root,
#                 oversubscribed)
#   --train-bundle  also train, with the bundle scripts/gpu-bundle.sh
#                 pack-train made (trident, Open MPI, HDF5, OpenBLAS and
#                 their libraries; for the project's GPU machine, which has
#                 none of them): the same checks as --trident, on the GPU;
#                 with --dry-run on the emulated device, in a scrubbed
#                 environment (gpu-bundle.sh test-train)
#
# Environment: TRIDENT_CUDA_ARCH (default of --arch), TRIDENT_GPU_BUILD_TIMEOUT
# (seconds for the build step, default 360; a 2-core CPU machine needs more).
# NCCL: the toolkit's, else the one in PyTorch's nvidia-nccl wheel (found
# through python3), for building test_nccl_comm and for running it.
#
# Exit 0: everything built and every test passed (with --dry-run: built,
# every test skipped, bundle packed); 1: a step failed (the summary names it);
# 2: bad flag.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dry_run=0
build=build-gpu
pack=build-gpu-carry
prebuilt=""
arch=${TRIDENT_CUDA_ARCH:-90}
torch=1
trident_bin=""
train_bundle=""
mpirun_cmd="mpirun --allow-run-as-root --oversubscribe --bind-to none"
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) dry_run=1 ;;
    --build-dir) build=${2:?--build-dir needs a value}; shift ;;
    --pack) pack=${2:?--pack needs a value}; shift ;;
    --prebuilt) prebuilt=${2:?--prebuilt needs a value}; shift ;;
    --arch) arch=${2:?--arch needs a value}; shift ;;
    --no-torch) torch=0 ;;
    --trident) trident_bin=${2:?--trident needs a value}; shift ;;
    --mpirun) mpirun_cmd=${2:?--mpirun needs a value}; shift ;;
    --train-bundle) train_bundle=${2:?--train-bundle needs a value}; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-check.sh: unknown flag $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [[ $dry_run = 1 && -n $prebuilt ]]; then
  echo "gpu-check.sh: --dry-run builds and packs; --prebuilt is for the GPU machine" >&2
  exit 2
fi
[[ $build = /* ]] || build=$repo/$build
[[ $pack = /* ]] || pack=$repo/$pack
[[ -z $prebuilt || $prebuilt = /* ]] || prebuilt=$repo/$prebuilt
[[ -z $train_bundle || $train_bundle = /* ]] || train_bundle=$repo/$train_bundle
if [[ -n $trident_bin && -n $train_bundle ]]; then
  echo "gpu-check.sh: --trident and --train-bundle both train; give one" >&2
  exit 2
fi
mode=gpu
[[ $dry_run = 1 ]] && mode=dry-run
# The limit of the whole test step; every test's own timeout must be below it
# (tests/gpu/CMakeLists.txt: 60 s each), so a hung test fails by itself.
test_step_limit=240
max_bundle_mib=60
t_start=$SECONDS
summary=()
failed=0
note() { summary+=("$1"); echo "== $1"; }
fail() { note "FAIL: $1"; failed=1; }

# Runs "$@" with a limit of $1 seconds.
step() {
  local limit=$1; shift
  timeout --signal=TERM --kill-after=10 "$limit" "$@"
}

# The directory of PyTorch's NCCL (nvidia-nccl wheel), if python3 has one.
torch_nccl_dir() {
  command -v python3 >/dev/null || return 0
  python3 - <<'EOF' 2>/dev/null
import glob, sys
for p in sys.path:
    for lib in glob.glob(p + "/nvidia/nccl/lib/libnccl.so.2"):
        print(lib.rsplit("/lib/", 1)[0])
        sys.exit(0)
EOF
}

# Checks (with python3) that every test ctest registered in $1 has a TIMEOUT
# below the step limit; one line.
check_timeouts() {
  (cd "$1" && ctest --show-only=json-v1 -L gpu) | python3 -c '
import json, sys
limit = float(sys.argv[1])
tests = json.load(sys.stdin)["tests"]
bad = []
for t in tests:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    if float(props.get("TIMEOUT", 1500)) >= limit:
        bad.append("%s (%s s)" % (t["name"], props.get("TIMEOUT", "none")))
if bad:
    print("timeouts: not under the %g s test step: %s" % (limit, ", ".join(bad)))
    sys.exit(1)
print("timeouts: all %d tests under the %g s test step" % (len(tests), limit))
' "$test_step_limit"
}

echo "== gpu-check: $(date -u +%FT%TZ) on $(hostname), repository $repo"
[[ $dry_run = 1 ]] && echo "== DRY RUN: nothing here runs on a GPU"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
  echo "nvidia-smi: not found"
fi
nccl_dir=$(torch_nccl_dir)
[[ -n $nccl_dir ]] && echo "PyTorch's NCCL: $nccl_dir"

# ---- the verdict logic itself (no GPU needed) ----
mkdir -p "$build"
if [[ $dry_run = 1 ]]; then
  if bash "$repo/tests/unit/scripts/test_gpu_check_verdict.sh" > "$build/verdict-selftest.log" 2>&1; then
    note "verdict logic: $(tail -1 "$build/verdict-selftest.log")"
  else
    cat "$build/verdict-selftest.log"
    fail "verdict logic (log above)"
  fi
fi

# ---- a packed bundle, if given and usable here ----
use_bundle=0
if [[ -n $prebuilt ]]; then
  tree_source=$(bash "$repo/scripts/gpu-bundle.sh" source-hash)
  bundle_source=$(sed -n 's/^source: //p' "$prebuilt/MANIFEST" 2>/dev/null)
  probe=$(LD_LIBRARY_PATH="$prebuilt/lib${nccl_dir:+:$nccl_dir/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$prebuilt/bin/test_gpu_ops" --libraries 2>&1 | tail -1)
  if [[ ! -f $prebuilt/tests.txt ]]; then
    note "bundle: $prebuilt has no tests.txt; building from source"
  elif [[ $bundle_source != "$tree_source" ]]; then
    note "bundle: packed from sources ${bundle_source:-?}, this tree is $tree_source; building from source"
  elif [[ $probe != "libraries: cuBLAS loaded" ]]; then
    note "bundle: its binaries do not start here ($probe); building from source"
  else
    use_bundle=1
    note "bundle: $prebuilt (packed $(sed -n 's/^packed: //p' "$prebuilt/MANIFEST"), sources $bundle_source)"
  fi
fi

# ---- configure and build (kernels, reference kernels, tests, benchmark) ----
if [[ $use_bundle = 0 && $failed = 0 ]]; then
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  if [[ ! -x $nvcc ]]; then
    echo "gpu-check.sh: no nvcc on PATH or in /usr/local/cuda/bin" >&2
    exit 1
  fi
  "$nvcc" --version | tail -1
  cmake --version | head -1
  generator=(-G Ninja)
  command -v ninja >/dev/null || generator=(-G "Unix Makefiles")
  nccl_args=()
  if [[ -n $nccl_dir && ! -e $(dirname "$nvcc")/../include/nccl.h ]]; then
    nccl_args=(-DNCCL_INCLUDE_DIR="$nccl_dir/include" -DNCCL_LIBRARY="$nccl_dir/lib/libnccl.so.2")
  fi
  mkdir -p "$build"
  if step 120 cmake -S "$repo/tests/gpu" -B "$build" "${generator[@]}" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_COMPILER="$nvcc" \
      -DCMAKE_CUDA_ARCHITECTURES="$arch" "${nccl_args[@]}" > "$build/configure.log" 2>&1; then
    note "configure: ok (CUDA architectures $arch)"
    grep -q "no NCCL found" "$build/configure.log" && note "configure: no NCCL, test_nccl_comm not built"
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
  if [[ $failed = 0 ]]; then
    if ! command -v python3 >/dev/null; then
      note "timeouts: not checked (no python3)"
    elif line=$(check_timeouts "$build"); then
      note "$line"
    else
      fail "$line"
    fi
  fi
fi

# ---- tests ----
bin_dir=$build
run_env=()
if [[ $use_bundle = 1 ]]; then
  bin_dir=$prebuilt/bin
  run_env=(env "LD_LIBRARY_PATH=$prebuilt/lib${nccl_dir:+:$nccl_dir/lib}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
elif [[ -n $nccl_dir ]]; then
  run_env=(env "LD_LIBRARY_PATH=$nccl_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
fi

if [[ $failed = 0 || $use_bundle = 1 ]]; then
  test_log=$build/tests.log
  if [[ $use_bundle = 1 ]]; then
    registered=$(grep -c . "$prebuilt/tests.txt")
    step "$test_step_limit" bash "$repo/scripts/gpu-bundle.sh" run "$prebuilt" "${nccl_dir:+$nccl_dir/lib}" 2>&1 | tee "$test_log"
    status=${PIPESTATUS[0]}
  else
    registered=$(cd "$build" && ctest -N -L gpu | sed -n 's/^Total Tests: //p')
    (cd "$build" && step "$test_step_limit" "${run_env[@]}" ctest -L gpu --output-on-failure -j1) 2>&1 | tee "$test_log"
    status=${PIPESTATUS[0]}
  fi
  if line=$(bash "$repo/scripts/gpu-check-verdict.sh" "$mode" "$status" "${registered:-0}" "$test_log"); then
    note "$line"
  else
    fail "$line"
  fi
fi

# ---- the host checks of the standalone build (no device needed): the bf16
# bounds against simulated arithmetic, the cuBLAS math of every GEMM ----
if [[ $use_bundle = 0 && $failed = 0 && -f $build/CTestTestfile.cmake ]]; then
  if (cd "$build" && step 120 ctest -R '^(test_bf16_bounds|test_cublas_math)$' --output-on-failure) \
      > "$build/host-checks.log" 2>&1; then
    note "host checks: $(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' "$build/host-checks.log") passed (bf16 bounds, cuBLAS math)"
  else
    cat "$build/host-checks.log"
    fail "host checks (log above)"
  fi
fi

# ---- a missing cuBLAS is one line, not an abort (no device needed) ----
if [[ -x $bin_dir/test_gpu_ops ]]; then
  if out=$("${run_env[@]}" bash "$repo/tests/gpu/missing_cublas.sh" "$bin_dir/test_gpu_ops" 2>&1); then
    note "missing cuBLAS: one line, exit 1; cuBLAS found here"
  else
    echo "$out"
    fail "missing cuBLAS message (output above)"
  fi
fi

# ---- benchmark: PyTorch SDPA first (its numbers go into the table) ----
# Runs whenever the binaries exist, also after a failed test: the figures
# are worth having from a scarce GPU session (the summary still says FAIL).
if [[ -x $bin_dir/trident_gpu_bench ]]; then
  torch_file=$build/torch-sdpa.txt
  mkdir -p "$build"
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
  step 200 "${run_env[@]}" "$bin_dir/trident_gpu_bench" --torch "$torch_file"
  rc=$?
  case $rc in
    0) note "benchmark: table above" ;;
    77) if [[ $dry_run = 1 ]]; then note "benchmark: SKIP (no device), as a dry run expects"
        else fail "benchmark: SKIP on a GPU machine"; fi ;;
    *) fail "benchmark (exit $rc)" ;;
  esac
fi

# ---- the bundle for the GPU machine (dry run) ----
if [[ $dry_run = 1 && $failed = 0 ]]; then
  if out=$(bash "$repo/scripts/gpu-bundle.sh" pack "$build" "$pack" "$max_bundle_mib" "$arch"); then
    note "$out"
  else
    fail "$out"
  fi
fi

# ---- the training job on the device (needs a full trident build) ----
# The dry run's emulated device runs the same steps on a CPU (minutes).
train_limit=480
[[ $dry_run = 1 ]] && train_limit=1200
if [[ -n $trident_bin ]]; then
  device=cuda
  [[ $dry_run = 1 ]] && device=emulated
  if step "$train_limit" python3 "$repo/scripts/gpu-train-check.py" --bin "$trident_bin" \
      --device "$device" --mpirun "$mpirun_cmd" --out "$build/train-check" 2>&1 |
      tee "$build/train-check.log"; then
    note "training on $device: $(grep -c '^ok' "$build/train-check.log") checks passed (log above)"
  else
    fail "training on $device: $(grep '^FAIL' "$build/train-check.log" | head -1)"
  fi
elif [[ -n $train_bundle ]]; then
  verb=run-train
  device=cuda
  [[ $dry_run = 1 ]] && verb=test-train device=emulated
  if step "$train_limit" bash "$repo/scripts/gpu-bundle.sh" "$verb" "$train_bundle" --device "$device" 2>&1 |
      tee "$build/train-check.log"; then
    note "training on $device (bundle): $(grep -c '^ok' "$build/train-check.log") checks passed (log above)"
  else
    fail "training on $device (bundle): $(grep -m1 '^FAIL' "$build/train-check.log")"
  fi
else
  note "training on the GPU: not run (give --train-bundle ARCHIVE, or --trident BIN of a full build)"
fi

echo
echo "==== gpu-check summary ($((SECONDS - t_start)) s) ===="
for line in "${summary[@]}"; do echo "  $line"; done
[[ $dry_run = 1 ]] && echo "  DRY RUN: nothing ran on a GPU"
if [[ $failed = 0 ]]; then echo "RESULT: PASS"; else echo "RESULT: FAIL"; fi
exit $failed
