#!/usr/bin/env bash
# Configures and builds trident with Ninja in build/ (or $TRIDENT_BUILD_DIR):
# optimised with debug info, warnings as errors, tests included. Extra
# arguments go to cmake's configure step (e.g. -DTRIDENT_CUDA=OFF).
#
#   scripts/build.sh [-DOPTION=VALUE ...]
# Environment: TRIDENT_BUILD_DIR, TRIDENT_BUILD_TYPE (default RelWithDebInfo),
# TRIDENT_JOBS (parallel compile jobs, default: the number of cores).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TRIDENT_BUILD_DIR:-$repo/build}
jobs=${TRIDENT_JOBS:-$(nproc)}

# CUDA is built whenever nvcc exists (TRIDENT_CUDA=AUTO); the toolkit's usual
# place is not always on PATH (CI shells, sudo), so point CMake at it.
if [[ -z ${CUDACXX:-} ]] && ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi

cmake -S "$repo" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE="${TRIDENT_BUILD_TYPE:-RelWithDebInfo}" \
  -DTRIDENT_WERROR=ON "$@"
cmake --build "$build" -j "$jobs"
echo "build.sh: built $build/trident" >&2
