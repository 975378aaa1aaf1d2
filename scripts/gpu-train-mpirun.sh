#!/bin/sh
# bin/mpirun of the GPU training bundle (scripts/gpu-bundle.sh pack-train):
# Open MPI's launcher from the bundle, with its folders (OPAL_PREFIX, PMIx's
# PMIX_PREFIX), its parameters (ompi/etc, not the machine's /etc/openmpi)
# and the bundle's libraries first, then TRIDENT_BUNDLE_EXTRA_LIBS (NCCL,
# cuBLAS: run.sh sets it). The ranks it starts inherit this environment.
b=$(cd "$(dirname "$0")/.." && pwd)
export OPAL_PREFIX="$b/ompi" PMIX_PREFIX="$b/pmix"
export OMPI_MCA_mca_base_param_files="$b/ompi/etc/openmpi-mca-params.conf"
export LD_LIBRARY_PATH="$b/lib${TRIDENT_BUNDLE_EXTRA_LIBS:+:$TRIDENT_BUNDLE_EXTRA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$b/ompi/bin/orterun" --allow-run-as-root "$@"
