#!/usr/bin/env bash
# `trident bench gemm --sweep` and TRIDENT_CPU_GEMM_BLOCKS end to end (one
# process): the header names the CPU, its caches, OpenBLAS's kernels and the
# parameters (derived, or the variable's); the sweep's two tables are in the
# HDF5 file as printed, every variant's rows checked (#wrong 0), one fastest
# row per layer and op; a bad value of the variable is one line naming it,
# exit 2, before anything is measured. Tiny sizes: behaviour, not speed.
source "$(dirname "${BASH_SOURCE[0]}")/../../support/bench_smoke.sh"
export OPENBLAS_NUM_THREADS=1
write_tiny_config </dev/null

timeout 120 "$bin" bench gemm "$tmp/tiny.toml" --sweep --reps 1 --output "$tmp/s.h5" >"$tmp/s.out" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then echo "FAIL bench gemm --sweep rc=$rc"; cat "$tmp/s.out"; fail=1; fi
grep -q '# wrong rows in total: 0 (OK)' "$tmp/s.out" || { echo "FAIL sweep verdict"; fail=1; }
grep -q '^# host: .*L1d .*, L2 .*BLAS: ' "$tmp/s.out" || { echo "FAIL header: host"; fail=1; }
grep -q '^# fp32 GEMM parameters: direct=.*(derived from the caches)' "$tmp/s.out" ||
  { echo "FAIL header: parameters"; fail=1; }
check_h5 "$tmp/s.h5" <<'PY'
all_, best = f["bench/gemm_sweep"], f["bench/gemm_sweep_best"]
n, nbest = int(all_.attrs["rows"]), int(best.attrs["rows"])
# per layer shape: 3 ops, one fastest each; 7 variants forward, 13 each backward op
assert nbest % 3 == 0 and nbest >= 12, nbest
assert n == nbest // 3 * (7 + 13 + 13), (n, nbest)
assert (all_["#wrong"][:] == 0).all()
variants = [v.decode() for v in all_["variant"][:]]
assert variants.count("sgemm") == variants.count("in use") == nbest, variants
params = [p.decode() for p in all_["params"][:]]
assert all(p.startswith("direct=0,") for v, p in zip(variants, params) if v == "sgemm")
assert all(",prefetch=24," in p for v, p in zip(variants, params) if v == "own prefetch=24")
for fastest in best["fastest"][:]:
    assert fastest.decode() in variants
print("ok   sweep: %d rows, %d fastest" % (n, nbest))
PY

TRIDENT_CPU_GEMM_BLOCKS=prefetch=12,mc=64 timeout 60 "$bin" bench gemm --sizes 40 --dtype f32 \
  --reps 1 >"$tmp/o.out" 2>&1 || { echo "FAIL override run"; cat "$tmp/o.out"; fail=1; }
grep -q '^# fp32 GEMM parameters: .*mc=64,prefetch=12,.*(TRIDENT_CPU_GEMM_BLOCKS)' "$tmp/o.out" ||
  { echo "FAIL override not named"; cat "$tmp/o.out"; fail=1; }

# bad values: one line naming the variable and the rule, exit 2
for bad in "mc=12:multiple of 8" "prefetch=99:0 (none) to 64" "speed=3:unknown key" "kc=:whole number"; do
  expect_input_error "TRIDENT_CPU_GEMM_BLOCKS: '${bad%%:*}': .*${bad#*:}" \
    env TRIDENT_CPU_GEMM_BLOCKS="${bad%%:*}" "$bin" bench gemm --sizes 8 --reps 1
  [[ $(wc -l <"$tmp/err") -eq 1 ]] || { echo "FAIL more than one line: $bad"; cat "$tmp/err"; fail=1; }
done
exit $fail
