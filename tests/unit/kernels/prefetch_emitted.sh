#!/usr/bin/env bash
# The native bf16 kernels' software prefetches reach the binary. GCC 12 once
# took a helper that only called __builtin_prefetch for a function without
# effects and dropped every call, so gemm_bf16.cpp ran without a prefetch
# for a whole session (issue 48, gemm48b: about 6% of the dense native
# step). This reads the compiled objects: a code-generation check, not a
# timing. Exit 77 (skip) without objdump or on a non-x86-64 build.
#
#   prefetch_emitted.sh OBJECT...   (ctest passes trident_kernels' objects)
set -u
command -v objdump >/dev/null || { echo "SKIP: no objdump on PATH"; exit 77; }
fail=0
for name in gemm_bf16.cpp attention_bf16.cpp attention_bf16_backward.cpp; do
  obj=""
  for o in "$@"; do [[ $(basename "$o") == "$name.o" ]] && obj=$o; done
  [[ -n $obj ]] || { echo "FAIL no object for $name among the arguments"; fail=1; continue; }
  if ! objdump -f "$obj" | grep -q 'x86-64'; then
    echo "SKIP: $obj is not x86-64 code"; exit 77
  fi
  n=$(objdump -d "$obj" | grep -c -E '\sprefetch(t0|t1|t2|nta|w)\s')
  if [[ $n -gt 0 ]]; then echo "ok   $name: $n prefetch instructions"
  else echo "FAIL $name: no prefetch instruction in $obj"; fail=1; fi
done
exit $fail
