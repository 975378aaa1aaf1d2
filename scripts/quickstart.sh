#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and trains the
# quickstart model on 8 ranks of this machine (pp=2 x cp=2 x dp=2, ep=2).
# Extra arguments go to `trident run` (e.g. --set train.steps=20).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${TRIDENT_BUILD_DIR:-$repo/build}
"$repo/scripts/install-deps.sh"
"$repo/scripts/build.sh"

# Open MPI as ENVIRONMENT.md says: root allowed, more ranks than cores, UCX on
# any device (no InfiniBand here), no shared-memory BTL.
cd "$repo"
exec mpirun --allow-run-as-root --oversubscribe --bind-to none \
  --mca pml ucx --mca pml_ucx_devices any --mca pml_ucx_tls any --mca btl '^vader,openib' \
  -np 8 "$build/trident" run share/trident/examples/quickstart.toml "$@"
