#!/usr/bin/env bash
# `trident bench moe` end to end under mpirun: both transports run with
# verified results (#wrong = 0 is the exit code: combined elements against
# the local weighted sum, ep counter bytes against the routed copies), the
# HDF5 file holds both tables, the buffers live on the config's device (the
# emulated one here), and bad flags or config values are input errors (exit 2).
# Sizes are tiny: this checks behaviour, not speed.
source "$(dirname "${BASH_SOURCE[0]}")/../../support/bench_smoke.sh"

timeout 120 "${mpirun[@]}" -np 4 "$bin" bench moe --hidden 48 --tokens 200 --experts 8 --top-k 2 \
  --ffn 32 --iters 2 --warmup 1 --output "$tmp/m.h5" >"$tmp/out" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then echo "FAIL bench rc=$rc"; cat "$tmp/out"; fail=1; fi
for routing in balanced skewed; do
  for tr in alltoallv shm; do
    grep -qE "^ +$routing +$tr " "$tmp/out" || { echo "FAIL no row $routing/$tr"; cat "$tmp/out"; fail=1; }
  done
done
grep -q '# wrong elements or byte counts: 0 (OK)' "$tmp/out" || { echo "FAIL verdict line"; fail=1; }
check_h5 "$tmp/m.h5" <<'PY'
m = f["bench/moe"]
assert len(m["#wrong"][:]) == 4 and (m["#wrong"][:] == 0).all()
assert (m["sent_B_per_rank"][:] == 200 * 2 * 48 * 4).all()  # dropless: routed copies x d x 4
assert (m["raw_a2a_ms"][:] > 0).all()
assert len(f["bench/moe_split"]["count_ms"][:]) == 4
print("ok   hdf5")
PY

# One transport only, on 2 ranks.
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench moe --hidden 16 --tokens 50 --experts 4 --top-k 1 \
  --iters 1 --transport shm >"$tmp/out2" 2>&1 || { echo "FAIL shm only"; cat "$tmp/out2"; fail=1; }
if grep -qE '^ +balanced +alltoallv ' "$tmp/out2"; then echo "FAIL alltoallv row with --transport shm"; fail=1; fi

# Every buffer on the config's device (bench::open_job): on the emulated
# device a host access to one would stop the process (exit 86). shm is not
# offered there (its windows are host memory): alltoallv rows only.
timeout 120 "${mpirun[@]}" -np 4 "$bin" bench moe --set runtime.backend=emulated --hidden 16 \
  --tokens 40 --experts 8 --top-k 2 --ffn 8 --iters 1 >"$tmp/oute" 2>&1
rc=$?
if [[ $rc -ne 0 ]] || ! grep -q '# wrong elements or byte counts: 0 (OK)' "$tmp/oute" ||
  ! grep -qE '^ +skewed +alltoallv ' "$tmp/oute" || grep -qE '^ +balanced +shm ' "$tmp/oute"; then
  echo "FAIL emulated device rc=$rc"; cat "$tmp/oute"; fail=1
else
  echo "ok   emulated device"
fi
expect_input_error "--transport shm" "${mpirun[@]}" -np 2 "$bin" bench moe \
  --set runtime.backend=emulated --hidden 16 --tokens 10 --experts 2 --transport shm
expect_input_error "runtime.backend" \
  "${mpirun[@]}" -np 2 "$bin" bench moe --set runtime.backend=bogus --hidden 16 --tokens 10

# Input errors: one line naming the flag, exit 2.
for args in "--experts 6" "--top-k 9" "--transport nccl" "--iters 0"; do
  # shellcheck disable=SC2086
  expect_input_error "${args%% *}" "${mpirun[@]}" -np 4 "$bin" bench moe --hidden 16 --tokens 10 $args
done
exit $fail
