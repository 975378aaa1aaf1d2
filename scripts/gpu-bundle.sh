#!/usr/bin/env bash
# The bundle that carries the GPU tests to the GPU machine, so that its few
# minutes go to running them rather than compiling them (scripts/gpu-check.sh
# packs it on --dry-run and runs it on --prebuilt).
#
#   scripts/gpu-bundle.sh pack BUILD_DIR BUNDLE_DIR MAX_MIB ARCH
#       the test binaries and the benchmark of a tests/gpu build, stripped;
#       tests.txt (name, timeout in s, binary, arguments: what ctest registered
#       with label gpu); lib/ with the C++ runtime they were linked against
#       (the GPU machine's may be older); MANIFEST (source hash, CUDA
#       architectures, date). Fails when the bundle exceeds MAX_MIB.
#   scripts/gpu-bundle.sh run BUNDLE_DIR [EXTRA_LIB_DIR]
#       runs each test of tests.txt under its timeout, with lib/ (and
#       EXTRA_LIB_DIR, e.g. PyTorch's NCCL) on the library path, printing
#       ctest's result lines (scripts/gpu-check-verdict.sh reads them).
#   scripts/gpu-bundle.sh source-hash
#       the hash of the source tree (tracked and untracked, not ignored
#       files) that MANIFEST records, so that a bundle of other sources is
#       not run in their place.
#
# pack prints one line and exits 0, or 1 with the reason.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The source files: git's list (tracked, and untracked but not ignored), or
# where the tree is a copy without git (a device run), the files outside
# what .gitignore names, which is the same list.
source_files() {
  if git -C "$repo" rev-parse --git-dir > /dev/null 2>&1; then
    git -C "$repo" ls-files -z -co --exclude-standard
  else
    (cd "$repo" && find . -type f \
      -not -path './build*/*' -not -path './.venv/*' -not -path './.device-out/*' \
      -not -path './checkpoints/*' -not -path './.git/*' -not -path '*/__pycache__/*' \
      -not -name '*.pyc' -not -path '*.egg-info/*' -not -name 'trident-*.h5' -print0 |
      sed -z 's|^\./||')
  fi
}

source_hash() {
  source_files | LC_ALL=C sort -z | (cd "$repo" && xargs -0 sha1sum 2> /dev/null) | sha1sum |
    cut -c1-16
}

pack() {
  local build=$1 dir=$2 max_mib=$3 arch=$4
  if [[ ! -f $build/CTestTestfile.cmake ]]; then
    echo "bundle: $build is not a tests/gpu build"
    return 1
  fi
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib"
  if ! (cd "$build" && ctest --show-only=json-v1 -L gpu) | python3 -c '
import json, os, sys
for t in json.load(sys.stdin)["tests"]:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    cmd = t["command"]
    print(t["name"], props["TIMEOUT"], os.path.basename(cmd[0]), *cmd[1:])
' > "$dir/tests.txt"; then
    echo "bundle: cannot list the tests of $build"
    return 1
  fi
  local name limit bin args
  while read -r name limit bin args; do
    [[ -f $dir/bin/$bin ]] && continue
    if ! strip --strip-debug -o "$dir/bin/$bin" "$build/$bin"; then
      echo "bundle: cannot copy $build/$bin"
      return 1
    fi
  done < "$dir/tests.txt"
  strip --strip-debug -o "$dir/bin/trident_gpu_bench" "$build/trident_gpu_bench" || {
    echo "bundle: no trident_gpu_bench in $build"
    return 1
  }
  # The C++ runtime the binaries were linked against (not glibc: a binary
  # needs a glibc at least as new as this machine's; run falls back to a
  # source build when they do not start).
  local lib
  for lib in libstdc++.so.6 libgcc_s.so.1; do
    local path
    path=$(ldd "$dir/bin/test_gpu_ops" | awk -v l="$lib" '$1 == l { print $3 }')
    [[ -n $path ]] && cp -L "$path" "$dir/lib/$lib"
  done
  {
    echo "source: $(source_hash)"
    echo "commit: $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "packed: $(date -u +%FT%TZ) on $(hostname)"
    echo "cuda architectures: $arch"
    echo "tests: $(grep -c . "$dir/tests.txt")"
  } > "$dir/MANIFEST"
  local mib
  mib=$(du -sm "$dir" | cut -f1)
  if ((mib > max_mib)); then
    echo "bundle: $dir is $mib MiB, over the $max_mib MiB a device run carries"
    return 1
  fi
  echo "bundle: $dir, $(grep -c . "$dir/tests.txt") tests + benchmark, $mib MiB" \
    "(limit $max_mib); on the GPU machine: scripts/gpu-check.sh --prebuilt ${dir#"$repo"/}"
}

run() {
  local dir=$1 extra=${2:-}
  local path=$dir/lib${extra:+:$extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  local n=0 total name limit bin args rc t0 ms result
  total=$(grep -c . "$dir/tests.txt")
  while read -r name limit bin args; do
    n=$((n + 1))
    echo "    Start $n: $name"
    t0=$(date +%s%N)
    # shellcheck disable=SC2086  # args: words as ctest registered them
    LD_LIBRARY_PATH=$path timeout --kill-after=5 "$limit" "$dir/bin/$bin" $args < /dev/null
    rc=$?
    case $rc in
      0) result="   Passed" ;;
      77) result="***Skipped" ;;
      124 | 137) result="***Timeout" ;;
      *) result="***Failed" ;;
    esac
    ms=$((($(date +%s%N) - t0) / 1000000))
    printf '%3d/%d Test #%d: %s ......%s  %d.%03d sec\n' "$n" "$total" "$n" "$name" "$result" \
      $((ms / 1000)) $((ms % 1000))
  done < "$dir/tests.txt"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  source-hash) source_hash ;;
  *) echo "gpu-bundle.sh: usage: pack BUILD DIR MAX_MIB ARCH | run DIR [LIB_DIR] | source-hash" >&2
     exit 2 ;;
esac
