#!/usr/bin/env bash
# A GPU test binary whose cuBLAS cannot be loaded fails with one line naming
# the library and the loader's reason (exit 1), instead of aborting; with
# cuBLAS there it says so. Uses the binary's --libraries mode, which loads
# the libraries without a device, so it runs on any machine with the CUDA
# toolkit. TRIDENT_CUBLAS_LIBRARY points the loader at a file that is not
# there (the toolkit's copy is in the loader cache, so an empty library path
# would not hide it).
set -uo pipefail
bin=${1:?usage: missing_cublas.sh TEST_BINARY}
status=0
out=$(TRIDENT_CUBLAS_LIBRARY=/nonexistent/libcublas.so.13 "$bin" --libraries 2>&1)
rc=$?
lines=$(printf '%s\n' "$out" | wc -l)
if [[ $rc != 1 || $lines != 1 || $out != "FAIL: cuBLAS: cannot load /nonexistent/libcublas.so.13 (TRIDENT_CUBLAS_LIBRARY): "* ]]; then
  echo "FAIL: missing cuBLAS gave exit $rc and $lines line(s): $out"
  status=1
else
  echo "ok: missing cuBLAS -> exit 1, '$out'"
fi
out=$("$bin" --libraries 2>&1)
rc=$?
if [[ $rc != 0 || $out != "libraries: cuBLAS loaded" ]]; then
  echo "FAIL: with the toolkit's cuBLAS: exit $rc, '$out'"
  status=1
else
  echo "ok: $out"
fi
exit $status
