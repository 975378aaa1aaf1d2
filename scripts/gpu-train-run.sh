#!/usr/bin/env bash
# The runner of the GPU training bundle (scripts/gpu-bundle.sh pack-train
# copies it in as run.sh): runs scripts/gpu-train-check.py with the bundle's
# trident, Open MPI and libraries, on a machine that has none of them (the
# project's GPU machine: CUDA, a compiler and PyTorch, no MPI, HDF5 or BLAS).
#
#   run.sh [--device cuda|emulated] [--out DIR] [--libraries-only]
#
#   --device          cuda (default; the GPU) or emulated (the dry run a CPU
#                     machine can do)
#   --out             where the run files go (default: a new temporary folder)
#   --libraries-only  only check that every program and plugin of the bundle
#                     finds its libraries inside the bundle, and that trident
#                     starts
#
# From the machine it takes only glibc, python3, NCCL (which trident links;
# the bundle leaves its 200 MB out) and, for --device cuda, the driver and
# cuBLAS; it checks each first and names every one missing. NCCL:
# TRIDENT_NCCL_DIR, else python3's nvidia-nccl wheel (PyTorch's), else the
# CUDA toolkit's. cuBLAS: TRIDENT_CUBLAS_LIBRARY, else python3's nvidia
# wheels, else the toolkit's. The bundle's libraries reach only the programs
# of the bundle (through bin/mpirun), never python3, whose own C++ runtime
# may be newer. Exit 0 when every check passed, 1 otherwise, 2 bad flag.
set -uo pipefail
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
device=cuda
out=""
libraries_only=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) device=${2:?--device needs cuda or emulated}; shift ;;
    --out) out=${2:?--out needs a folder}; shift ;;
    --libraries-only) libraries_only=1 ;;
    *) echo "run.sh: unknown flag $1 (--device cuda|emulated, --out DIR, --libraries-only)" >&2
       exit 2 ;;
  esac
  shift
done
if [[ $device != cuda && $device != emulated ]]; then
  echo "run.sh: --device must be cuda or emulated, not $device" >&2
  exit 2
fi
echo "== GPU training bundle: $bundle"
sed 's/^/   /' "$bundle/MANIFEST"

# The first folder holding $1 among python3's site-packages (nvidia wheels)
# and the CUDA toolkit's library folders.
find_library_dir() {
  local name=$1 d
  if command -v python3 > /dev/null; then
    d=$(python3 - "$name" <<'EOF' 2> /dev/null
import glob, sys
for p in sys.path:
    for lib in sorted(glob.glob(p + "/nvidia/*/lib/" + sys.argv[1])):
        print(lib.rsplit("/", 1)[0])
        sys.exit(0)
EOF
)
    [[ -n $d ]] && { echo "$d"; return 0; }
  fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -e $d/$name ]] && { echo "$d"; return 0; }
  done
  return 1
}

# What the machine must provide (MANIFEST says so too), each checked, and
# every one missing named before anything runs.
missing=()
command -v python3 > /dev/null || missing+=("python3 (runs scripts/gpu-train-check.py)")
nccl_dir=${TRIDENT_NCCL_DIR:-}
[[ -z $nccl_dir ]] && nccl_dir=$(find_library_dir libnccl.so.2)
if [[ -z $nccl_dir || ! -e $nccl_dir/libnccl.so.2 ]]; then
  missing+=("NCCL: libnccl.so.2, which trident links (TRIDENT_NCCL_DIR, python3's nvidia-nccl wheel, /usr/local/cuda)")
fi
extra=$nccl_dir
if [[ $device = cuda ]]; then
  if [[ -z ${TRIDENT_CUBLAS_LIBRARY:-} ]]; then
    if cublas_dir=$(find_library_dir libcublas.so.13); then
      export TRIDENT_CUBLAS_LIBRARY=$cublas_dir/libcublas.so.13
    else
      missing+=("cuBLAS: libcublas.so.13 (TRIDENT_CUBLAS_LIBRARY, python3's nvidia-cublas wheel, /usr/local/cuda)")
    fi
  fi
  # cuBLASLt lies beside cuBLAS.
  [[ -n ${TRIDENT_CUBLAS_LIBRARY:-} ]] && extra=$extra:$(dirname "$TRIDENT_CUBLAS_LIBRARY")
  if ! { ldconfig -p 2> /dev/null | grep -q 'libcuda\.so\.1 '; } &&
      ! ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1 \
        /usr/local/nvidia/lib64/libcuda.so.1 > /dev/null 2>&1; then
    missing+=("the NVIDIA driver: libcuda.so.1")
  fi
fi
if ((${#missing[@]} > 0)); then
  printf 'FAIL this machine lacks %s\n' "${missing[@]}"
  exit 1
fi
echo "   NCCL: $nccl_dir/libnccl.so.2 (from this machine)"
[[ $device = cuda ]] && echo "   cuBLAS: $TRIDENT_CUBLAS_LIBRARY (from this machine)"
# bin/mpirun puts these after the bundle's lib/ for the programs it starts.
export TRIDENT_BUNDLE_EXTRA_LIBS=$extra

# ---- every program and plugin finds its libraries in the bundle ----
glibc='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1)$'
bad=()
checked=0
while IFS= read -r -d '' elf; do
  checked=$((checked + 1))
  # As bin/mpirun and bin/gpu-run-metrics start them: the bundle's lib/ first.
  if ! listing=$(LD_LIBRARY_PATH=$bundle/lib:$nccl_dir ldd "$elf" 2>&1); then
    bad+=("${elf#"$bundle"/}: ldd fails: $(tail -1 <<< "$listing")")
    continue
  fi
  while read -r name arrow path _; do
    [[ $arrow = "=>" ]] || continue
    [[ $name =~ $glibc ]] && continue
    if [[ $path = "not" ]]; then
      bad+=("${elf#"$bundle"/}: $name not found")
    elif [[ $path != "$bundle"/* && $path != "$nccl_dir/libnccl.so.2" ]]; then
      bad+=("${elf#"$bundle"/}: $name from $path, outside the bundle")
    fi
  done <<< "$listing"
done < <(find "$bundle/bin" "$bundle/libexec" "$bundle/ompi" "$bundle/pmix" "$bundle/lib" -type f -print0 |
  while IFS= read -r -d '' f; do  # the ELF files (no `file` on every machine)
    [[ $(head -c 4 "$f" | od -An -tx1 | tr -d ' \n') = 7f454c46 ]] && printf '%s\0' "$f"
  done)
if ((${#bad[@]} > 0)); then
  printf 'FAIL library: %s\n' "${bad[@]}"
  exit 1
fi
echo "ok   libraries: $checked programs and libraries resolve inside the bundle" \
  "(glibc and NCCL from this machine)"
if ! version=$(LD_LIBRARY_PATH=$bundle/lib:$extra "$bundle/bin/trident" --version 2>&1); then
  echo "FAIL trident does not start here: $version"
  exit 1
fi
echo "ok   trident starts: $version"
[[ $libraries_only = 1 ]] && exit 0

out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/trident-gpu-train.XXXXXX")}
exec python3 "$bundle/scripts/gpu-train-check.py" --bin "$bundle/bin/trident" \
  --mpirun "$bundle/bin/mpirun" --metrics "$bundle/bin/gpu-run-metrics" --device "$device" \
  --out "$out"
