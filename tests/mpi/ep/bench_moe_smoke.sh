#!/usr/bin/env bash
# `trident bench moe` end to end under mpirun: both transports run with
# verified results (#wrong = 0 is the exit code: combined elements against
# the local weighted sum, ep counter bytes against the routed copies), the
# HDF5 file holds both tables, and bad flags are input errors (exit 2).
# Sizes are tiny: this checks behaviour, not speed.
set -u
bin=${TRIDENT_BIN:?}
read -r -a mpirun <<<"${TRIDENT_MPIRUN:?}"
py=${TRIDENT_PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

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
if [[ ! -f $tmp/m.h5 ]]; then
  echo "FAIL no $tmp/m.h5"; fail=1
else
  "$py" - "$tmp/m.h5" <<'PY' || fail=1
import sys, h5py
f = h5py.File(sys.argv[1], "r")
assert f.attrs["format"] in (b"trident-bench", "trident-bench"), f.attrs["format"]
m = f["bench/moe"]
assert len(m["#wrong"][:]) == 4 and (m["#wrong"][:] == 0).all()
assert (m["sent_B_per_rank"][:] == 200 * 2 * 48 * 4).all()  # dropless: routed copies x d x 4
assert (m["raw_a2a_ms"][:] > 0).all()
assert len(f["bench/moe_split"]["count_ms"][:]) == 4
print("ok   hdf5")
PY
fi

# One transport only, on 2 ranks.
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench moe --hidden 16 --tokens 50 --experts 4 --top-k 1 \
  --iters 1 --transport shm >"$tmp/out2" 2>&1 || { echo "FAIL shm only"; cat "$tmp/out2"; fail=1; }
if grep -qE '^ +balanced +alltoallv ' "$tmp/out2"; then echo "FAIL alltoallv row with --transport shm"; fail=1; fi

# Input errors: one line naming the flag, exit 2.
for args in "--experts 6" "--top-k 9" "--transport nccl" "--iters 0"; do
  # shellcheck disable=SC2086
  timeout 60 "${mpirun[@]}" -np 4 "$bin" bench moe --hidden 16 --tokens 10 $args >"$tmp/err" 2>&1
  rc=$?
  flag=${args%% *}
  if [[ $rc -ne 2 ]] || ! grep -q -- "$flag" "$tmp/err"; then
    echo "FAIL '$args': rc=$rc (want 2 naming $flag)"; cat "$tmp/err"; fail=1
  else
    echo "ok   '$args' -> exit 2"
  fi
done
exit $fail
