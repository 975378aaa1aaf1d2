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
#   scripts/gpu-bundle.sh pack-train BUILD_DIR OUT_DIR MAX_MIB
#       the training bundle OUT_DIR/trident-train.tar.xz for a machine with
#       no MPI, HDF5 or BLAS: the trident of a full build (CUDA backend),
#       gpu-run-metrics (scripts/gpu-run-metrics.c, reads run files where
#       Python has no h5py), every library they and Open MPI's launcher and
#       plugins load except glibc and NCCL (lib/), Open MPI (ompi/, found
#       through OPAL_PREFIX) and PMIx (pmix/, PMIX_PREFIX) relocated,
#       bin/mpirun (the launcher in that environment), run.sh
#       (scripts/gpu-train-run.sh), scripts/gpu-train-check.py, the
#       quickstart config and a MANIFEST. Fails when the archive is not
#       under MAX_MIB.
#   scripts/gpu-bundle.sh run-train ARCHIVE [run.sh flags]
#       unpacks ARCHIVE into a new temporary folder and runs its run.sh
#       (on the GPU machine: --device cuda, the default).
#   scripts/gpu-bundle.sh test-train ARCHIVE [run.sh flags]
#       the bundle's proof on a CPU machine: unpacks ARCHIVE into an empty
#       folder and runs run.sh --device emulated in a scrubbed environment
#       (env -i; PATH: the bundle, /usr/bin, /bin) and, where a mount
#       namespace can be made (unshare), with the system's copies of every
#       bundled library, Open MPI's, PMIx's, HDF5's and OpenBLAS's folders,
#       the CUDA toolkit and every python3's NVIDIA wheels hidden (NCCL, which
#       the machine must provide, copied aside first).
#   scripts/gpu-bundle.sh source-hash
#       the hash of the source tree (tracked and untracked, not ignored
#       files) that MANIFEST records, so that a bundle of other sources is
#       not run in their place.
#
# pack and pack-train print one line and exit 0, or 1 with the reason.
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

# ---- the training bundle ----

# Left to the machine: glibc (a binary needs a glibc at least as new as the
# one it was linked against; run.sh says when trident does not start), NCCL
# and the driver.
not_bundled='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libnccl\.so\.2|libcuda\.so\.1)$'

# "name path" of every library that $@ load (ldd lists the whole closure).
library_closure() {
  local f
  for f in "$@"; do ldd "$f"; done | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u
}

# Open MPI's plugins the bundle keeps: not those of networks a one-node run
# does not use (UCX, libfabric, InfiniBand, PSM), whose libraries would need
# plugin folders of their own, nor any whose libraries are missing here.
keep_plugin() {
  [[ ! $(basename "$1") =~ _(ucx|ofi|openib|psm|psm2|verbs)\.so$ && $(ldd "$1") != *"not found"* ]]
}

# Open MPI's folder $2 (Prefix, Pkglibdir, Pkgdatadir) from ompi_info's text $1.
ompi_path() { awk -v k="$2:" '$1 == k { print $2; exit }' <<< "$1"; }

pack_train() {
  local build=$1 out=$2 max_mib=$3
  local trident=$build/trident
  if [[ ! -x $trident ]]; then
    echo "bundle: no trident in $build (a full build: cmake -S . -B $build)"
    return 1
  fi
  if [[ $(ldd "$trident") != *libcudart* ]]; then  # (grep -q under pipefail: SIGPIPE)
    echo "bundle: $trident is not built with the CUDA backend (TRIDENT_CUDA=ON)"
    return 1
  fi
  local orterun paths
  orterun=$(readlink -f "$(command -v orterun || command -v mpirun)")
  paths=$(ompi_info --path all 2> /dev/null)
  if [[ ! -x $orterun || -z $paths ]]; then
    echo "bundle: no Open MPI here (orterun and ompi_info on PATH)"
    return 1
  fi
  local prefix pkglib pkgdata
  prefix=$(ompi_path "$paths" Prefix)
  pkglib=$(ompi_path "$paths" Pkglibdir)
  pkgdata=$(ompi_path "$paths" Pkgdatadir)
  local work
  work=$(mktemp -d) || return 1
  local b=$work/trident-train
  local ompi_lib=$b/ompi/${pkglib#"$prefix"/} ompi_data=$b/ompi/${pkgdata#"$prefix"/}
  mkdir -p "$b/bin" "$b/libexec" "$b/lib" "$b/ompi/bin" "$b/ompi/etc" "$ompi_lib" "$ompi_data" \
    "$b/pmix/lib/pmix" "$b/pmix/share/pmix" "$b/scripts" "$b/share/trident/examples"

  strip --strip-debug -o "$b/bin/trident" "$trident" || return 1
  # shellcheck disable=SC2046  # pkg-config's words
  if ! cc -O2 -Wall -o "$b/libexec/gpu-run-metrics" "$repo/scripts/gpu-run-metrics.c" \
      $(pkg-config --cflags --libs hdf5-openmpi); then
    echo "bundle: cannot build gpu-run-metrics (pkg-config hdf5-openmpi)"
    return 1
  fi
  # python3 runs it: the bundle's libraries for it alone (an RPATH would not
  # reach past libmpi, whose RUNPATH names the system's Open MPI).
  # shellcheck disable=SC2016  # the wrapper's own variables
  printf '%s\n' '#!/bin/sh' '# The run file reader with the bundle'"'"'s libraries (gpu-bundle.sh pack-train).' \
    'b=$(cd "$(dirname "$0")/.." && pwd)' \
    'LD_LIBRARY_PATH="$b/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$b/libexec/gpu-run-metrics" "$@"' \
    > "$b/bin/gpu-run-metrics"
  chmod 755 "$b/bin/gpu-run-metrics"
  cp "$orterun" "$b/ompi/bin/orterun"
  [[ -x $(dirname "$orterun")/orted ]] && cp "$(dirname "$orterun")/orted" "$b/ompi/bin/"
  local so
  for so in "$pkglib"/*.so; do
    if keep_plugin "$so"; then cp "$so" "$ompi_lib/"; fi
  done
  cp -r "$pkgdata"/. "$ompi_data/"
  # PMIx: its folder from where Open MPI's libpmix lives (plugins, help texts).
  local pmix
  pmix=$(library_closure "$ompi_lib"/mca_pmix_*.so | awk '$1 == "libpmix.so.2" { print $2; exit }')
  if [[ -n $pmix ]]; then
    pmix=$(dirname "$(dirname "$(readlink -f "$pmix")")")
    if [[ -d $pmix/lib/pmix ]]; then cp "$pmix"/lib/pmix/*.so "$b/pmix/lib/pmix/"; fi
    if [[ -d $pmix/share/pmix ]]; then cp -r "$pmix"/share/pmix/. "$b/pmix/share/pmix/"; fi
  fi
  # One node, ranks sharing it: shared memory without kernel-assisted copies
  # (which containers and gVisor may forbid), TCP for the rest.
  printf '%s\n' "pml = ob1" "btl = self,vader,tcp" "btl_vader_single_copy_mechanism = none" \
    "btl_base_warn_component_unused = 0" "rmaps_base_oversubscribe = 1" \
    "hwloc_base_binding_policy = none" > "$b/ompi/etc/openmpi-mca-params.conf"

  local name path n_libs=0
  while read -r name path; do
    [[ $name =~ $not_bundled ]] && continue
    cp -L "$path" "$b/lib/$name"
    n_libs=$((n_libs + 1))
  done < <(library_closure "$b/bin/trident" "$b/libexec/gpu-run-metrics" "$b/ompi/bin"/* \
    "$ompi_lib"/*.so "$b/pmix/lib/pmix"/*.so)

  install -m 755 "$repo/scripts/gpu-train-mpirun.sh" "$b/bin/mpirun"
  install -m 755 "$repo/scripts/gpu-train-run.sh" "$b/run.sh"
  cp "$repo/scripts/gpu-train-check.py" "$b/scripts/"
  cp "$repo/share/trident/examples/quickstart.toml" "$b/share/trident/examples/"
  local glibc_needed
  glibc_needed=$(objdump -T "$b/bin/trident" "$b"/lib/*.so* 2> /dev/null |
    grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  {
    echo "source: $(source_hash)"
    echo "commit: $(git -C "$repo" rev-parse HEAD 2> /dev/null || echo unknown)"
    echo "packed: $(date -u +%FT%TZ) on $(hostname)"
    echo "trident: $(LD_LIBRARY_PATH=$b/lib "$trident" --version 2>&1 | head -1) ($build)"
    echo "cuda code: $(grep -o -- '--generate-code=arch=compute_[0-9a-z]*,code=[^ ]*' \
      "$build/build.ninja" "$build/Makefile" 2> /dev/null | sed 's/.*code=//' | sort -u |
      tr '\n' ' ')"
    echo "libraries: $n_libs in lib/"
    echo "machine must provide: $glibc_needed or newer; python3 (runs the check); NCCL 2"
    echo "  (libnccl.so.2, which trident links: PyTorch's nvidia-nccl wheel or the CUDA toolkit;"
    echo "  218 MB, too large to carry); for --device cuda the NVIDIA driver (libcuda.so.1) and"
    echo "  cuBLAS $(cublas_major) (libcublas.so.$(cublas_major) and libcublasLt: the toolkit or"
    echo "  PyTorch's nvidia-cublas wheel); to unpack: tar with xz, or python3 (run-train falls"
    echo "  back to its tarfile). run.sh checks each and names every one missing"
    echo "open mpi: $(ompi_info --version 2> /dev/null | head -1)"
  } > "$b/MANIFEST"

  mkdir -p "$out" || return 1
  local archive=$out/trident-train.tar.xz
  rm -f "$archive"
  if ! tar -C "$work" -cf - trident-train | xz -T2 -9 > "$archive"; then
    echo "bundle: cannot write $archive"
    rm -rf "$work"
    return 1
  fi
  local unpacked mib
  unpacked=$(du -sm "$b" | cut -f1)
  mib=$((($(stat -c %s "$archive") + 1048575) / 1048576))
  rm -rf "$work"
  if ((mib >= max_mib)); then
    echo "bundle: $archive is $mib MiB, not under the $max_mib MiB limit"
    return 1
  fi
  echo "bundle: $archive, $mib MiB ($unpacked MiB unpacked, $n_libs libraries; limit" \
    "$max_mib); on the GPU machine: scripts/gpu-bundle.sh run-train ${archive#"$repo"/}"
}

# The cuBLAS major version trident loads (kernels/cuda/cublas_api.cpp:
# libcublas.so.<CUBLAS_VER_MAJOR>), from the toolkit's header.
cublas_major() {
  local h
  for h in /usr/local/cuda/include/cublas_api.h /usr/include/cublas_api.h; do
    [[ -e $h ]] && { awk '$2 == "CUBLAS_VER_MAJOR" { print $3; exit }' "$h"; return; }
  done
  echo "?"
}

# Unpacks $1 into a new folder under TMPDIR; prints the bundle's folder. A
# machine without xz unpacks it with python3's tarfile (its lzma module).
unpack_train() {
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/trident-train.XXXXXX") || return 1
  if command -v xz > /dev/null; then
    tar -C "$dir" -xJf "$1"
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$dir"
  fi || {
    echo "gpu-bundle.sh: cannot unpack $1" >&2
    return 1
  }
  echo "$dir/trident-train"
}

run_train() {
  local b
  b=$(unpack_train "$1") || return 1
  shift
  bash "$b/run.sh" "$@"
}

# The system's copies the bundle replaces: every bundled library where the
# loader would find it, and Open MPI's, PMIx's, HDF5's and OpenBLAS's
# folders (and hwloc's plugins); not the libraries that bash, python3 and
# coreutils load.
hidden_paths() {
  local b=$1 keep lib d
  keep=$(library_closure "$(readlink -f /bin/bash)" "$(readlink -f /usr/bin/python3)" /bin/ls \
    | awk '{ print $1 }')
  for lib in "$b"/lib/*; do
    lib=$(basename "$lib")
    grep -qxF "$lib" <<< "$keep" && continue
    for d in /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/local/cuda/lib; do
      if [[ -e $d/$lib ]]; then readlink -f "$d/$lib"; fi
    done
  done
  for d in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 \
    /usr/lib/x86_64-linux-gnu/hdf5 /usr/lib/x86_64-linux-gnu/openblas-pthread /usr/share/openmpi \
    /etc/openmpi /usr/lib/x86_64-linux-gnu/ucx /usr/lib/x86_64-linux-gnu/hwloc; do
    if [[ -d $d ]]; then echo "$d"; fi
  done
  # The CUDA toolkit and the NVIDIA wheels of every python3 here (PyTorch's):
  # the machine provides NCCL alone (test_train copies it aside), so a
  # library taken from the toolkit or a wheel instead of the bundle fails.
  for d in /usr/local/cuda /usr/local/cuda-*; do
    if [[ -d $d ]]; then readlink -f "$d"; fi
  done
  local py
  for py in /usr/bin/python3 "$(command -v python3)"; do
    [[ -x $py ]] || continue
    "$py" -c 'import glob, sys
for p in sys.path:
    for d in glob.glob(p + "/nvidia"):
        print(d)' 2> /dev/null
  done
}

test_train() {
  local b
  b=$(unpack_train "$1") || return 1
  shift
  local dir
  dir=$(dirname "$b")
  # NCCL, which the bundle leaves to the machine, alone in a folder.
  local nccl=""
  for nccl in /usr/local/cuda/lib64/libnccl.so.2 /usr/local/cuda/lib/libnccl.so.2 \
    /usr/lib/x86_64-linux-gnu/libnccl.so.2 ""; do
    [[ -e $nccl ]] && break
  done
  if [[ -z $nccl ]]; then
    echo "test-train: no libnccl.so.2 here (the toolkit's)"
    return 1
  fi
  # A copy, not a link: the toolkit it comes from is hidden below.
  mkdir -p "$dir/nccl" "$dir/empty"
  cp -l "$(readlink -f "$nccl")" "$dir/nccl/libnccl.so.2" 2> /dev/null ||
    cp "$(readlink -f "$nccl")" "$dir/nccl/libnccl.so.2"
  local scrubbed=(env -i "PATH=$b/bin:/usr/bin:/bin" "HOME=$dir" "TMPDIR=$dir"
    "TRIDENT_NCCL_DIR=$dir/nccl" bash "$b/run.sh" --device emulated --out "$dir/runs" "$@")
  if ! unshare -m --propagation private true 2> /dev/null; then
    echo "test-train: $b, scrubbed environment; no mount namespace here, system copies not hidden"
    "${scrubbed[@]}"
    finish_test "$dir" $?
    return
  fi
  # Files before the folders that hold them (reverse order): a folder hidden
  # first would leave nothing to bind over.
  hidden_paths "$b" | sort -ur > "$dir/hidden.txt"
  echo "test-train: $b, scrubbed environment, $(wc -l < "$dir/hidden.txt") system paths hidden" \
    "($dir/hidden.txt)"
  # shellcheck disable=SC2016  # the inner script's own variables
  unshare -m --propagation private bash -c '
    while read -r p; do
      if [[ -d $p ]]; then mount --bind "$1" "$p"; else mount --bind /dev/null "$p"; fi || exit 1
    done < "$2"
    shift 2
    exec "$@"' hide "$dir/empty" "$dir/hidden.txt" "${scrubbed[@]}"
  finish_test "$dir" $?
}

# Removes the test's folder when it passed (exit status $2); keeps it to look
# at when not.
finish_test() {
  if [[ $2 = 0 ]]; then
    [[ $1 = */trident-train.* ]] && rm -rf "$1"  # unpack_train's folder, nothing else
  else
    echo "test-train: exit $2; the unpacked bundle and its runs stay in $1"
  fi
  return "$2"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  pack-train) shift; pack_train "$@" ;;
  run-train) shift; run_train "$@" ;;
  test-train) shift; test_train "$@" ;;
  source-hash) source_hash ;;
  *) echo "gpu-bundle.sh: usage: pack BUILD DIR MAX_MIB ARCH | run DIR [LIB_DIR] |" \
       "pack-train BUILD OUT_DIR MAX_MIB | run-train ARCHIVE [FLAGS] |" \
       "test-train ARCHIVE [FLAGS] | source-hash" >&2
     exit 2 ;;
esac
