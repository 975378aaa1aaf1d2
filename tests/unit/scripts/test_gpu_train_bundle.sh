#!/usr/bin/env bash
# The GPU training bundle (scripts/gpu-bundle.sh pack-train) packed from this
# build: under the size limit, and unpacked into an empty folder with a
# scrubbed environment and the system's copies of its libraries, Open MPI,
# PMIx, HDF5 and OpenBLAS hidden, every program, plugin and library of it
# resolves inside it and trident starts. (The whole emulated training check
# from the bundle, minutes long: scripts/gpu-bundle.sh test-train ARCHIVE.)
#
#   test_gpu_train_bundle.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1
src=$2
if [[ $(ldd "$build/trident" 2> /dev/null) != *libcudart* ]]; then
  echo "SKIP: $build/trident is built without the CUDA backend (the bundle carries a CUDA build)"
  exit 77
fi
for tool in ompi_info orterun pkg-config cc xz; do
  if ! command -v "$tool" > /dev/null; then
    echo "SKIP: no $tool here (the bundle is packed from Open MPI's and HDF5's development install)"
    exit 77
  fi
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! bash "$src/scripts/gpu-bundle.sh" pack-train "$build" "$work/out" 60; then
  echo "FAIL: pack-train"
  exit 1
fi
if ! TMPDIR=$work bash "$src/scripts/gpu-bundle.sh" test-train "$work/out/trident-train.tar.xz" \
    --libraries-only; then
  echo "FAIL: the unpacked bundle's libraries (output above)"
  exit 1
fi
echo "PASS: bundle packed, its libraries resolve inside it, trident starts"
