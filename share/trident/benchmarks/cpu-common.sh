# Shared by cpu-attention.sh and cpu-efficiency.sh (sourced, not run): the
# pinned one-thread setting, the 2048^3 sgemm ceiling by CPU time, and the
# loop that alternates the two binaries.
#
# The caller sets `old`, `new` (may be empty), `runs`, `out`, `core` and
# defines `measure BINARY LOG`; then calls cpu_bench_setup NAME and
# cpu_bench_alternate. `sides` holds old (and new) afterwards.

# NAME is the calling script, for its messages.
cpu_bench_setup() {
  local name=$1 b
  for b in "$old" $new; do
    [[ -x $b ]] || { echo "$name: $b is not an executable" >&2; exit 2; }
  done
  [[ -x /usr/bin/time ]] || { echo "$name: needs /usr/bin/time (Debian: time)" >&2; exit 2; }
  mkdir -p "$out"
  export OPENBLAS_NUM_THREADS=1
  pin=(taskset -c "$core")
  # The ceiling is only the machine's if OpenBLAS runs its best kernels here:
  # OPENBLAS_CORETYPE overrides its choice (a Zen 5 sandbox set it to Haswell,
  # whose AVX2 kernels reach half the AVX-512 rate), so the core goes in the logs.
  blas_core >"$out/blas-core"
  echo "$name: OpenBLAS kernels: $(<"$out/blas-core")${OPENBLAS_CORETYPE:+ (forced by OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE; unset it to measure against the kernels OpenBLAS picks for this CPU)}" >&2
  sides=(old)
  [[ -n $new ]] && sides+=(new)
  return 0
}

# the name of the kernels OpenBLAS runs in this environment (Haswell, SkylakeX, ...)
blas_core() {
  python3 -c 'import ctypes; b = ctypes.CDLL("libopenblas.so.0"); b.openblas_get_corename.restype = ctypes.c_char_p; print(b.openblas_get_corename().decode())'
}

# sgemm 2048^3 by CPU time through the same OpenBLAS, best of 3 after one
# warm-up: GFLOP/s
sgemm_cpu() {
  "${pin[@]}" python3 - <<'PY'
import ctypes, time
blas = ctypes.CDLL("libopenblas.so.0")
blas.openblas_set_num_threads(1)
n = 2048
one = b"\x00\x00\x80\x3f" * (n * n)
A = (ctypes.c_float * (n * n)).from_buffer_copy(one)
B = (ctypes.c_float * (n * n)).from_buffer_copy(one)
C = (ctypes.c_float * (n * n))()
best = float("inf")
for _ in range(4):  # the first warms up
    t0 = time.process_time()
    blas.cblas_sgemm(101, 111, 111, n, n, n, ctypes.c_float(1.0), A, n, B, n,
                     ctypes.c_float(0.0), C, n)
    best = min(best, time.process_time() - t0)
print(f"{2 * n**3 / best / 1e9:.3f}")
PY
}

# old, new, old, new, ...: a machine whose speed drifts affects both alike.
# Logs go to OUT/SIDE-RUN.log*.
cpu_bench_alternate() {
  local r side bin
  for ((r = 1; r <= runs; ++r)); do
    for side in "${sides[@]}"; do
      bin=$old
      [[ $side == new ]] && bin=$new
      echo "== run $r: $side ($bin) on core $core, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
      measure "$bin" "$out/$side-$r.log"
    done
  done
}
