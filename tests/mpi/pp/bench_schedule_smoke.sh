#!/usr/bin/env bash
# `trident bench schedule` end to end under mpirun: every schedule runs with
# verified boundary data (#wrong = 0 is the exit code), the HDF5 file holds
# the tables and the timeline, and a rank-count mismatch is an input error.
# Durations are tiny: this checks behaviour, not speed.
set -u
bin=${TRIDENT_BIN:?}
read -r -a mpirun <<<"${TRIDENT_MPIRUN:?}"
py=${TRIDENT_PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

timeout 120 "${mpirun[@]}" -np 2 "$bin" bench schedule --pp 2 --microbatches 4 --tf 1 --tb 1 --tw 1 \
  --steps 1 --bytes 256 --output "$tmp/b.h5" >"$tmp/out" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then echo "FAIL bench rc=$rc"; cat "$tmp/out"; fail=1; fi
for s in afab 1f1b interleaved zb-h1; do
  grep -qE "^ +$s " "$tmp/out" || { echo "FAIL no row for $s"; cat "$tmp/out"; fail=1; }
done
if [[ ! -f $tmp/b.h5 ]]; then
  echo "FAIL no $tmp/b.h5"; fail=1
else
  "$py" - "$tmp/b.h5" <<'PY' || fail=1
import sys, h5py
f = h5py.File(sys.argv[1], "r")
assert f.attrs["format"] in (b"trident-bench", "trident-bench"), f.attrs["format"]
t = f["bench/schedule_timeline"]
kinds = {k.decode() if isinstance(k, bytes) else k for k in t["kind"][:]}
assert {"F", "B", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"} <= kinds, kinds
assert (t["t_end_s"][:] >= t["t_begin_s"][:]).all()
assert len(f["bench/schedule/#wrong"][:]) == 4
assert (f["bench/schedule/hop_us"][:] >= 0).all()
print("ok   hdf5")
PY
fi

# Receives that go straight to the Communicator's wait (no polling) deliver the same data.
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench schedule --schedule zb-h1 --vpp 1 --pp 2 --microbatches 4 \
  --tf 1 --tb 1 --tw 1 --steps 1 --bytes 256 --recv-poll 0 >"$tmp/out3" 2>&1
rc=$?
if [[ $rc -ne 0 ]] || ! grep -qE "^ +zb-h1 .* 0$" "$tmp/out3"; then
  echo "FAIL recv-poll 0 rc=$rc"; cat "$tmp/out3"; fail=1
else
  echo "ok   recv-poll 0"
fi

timeout 60 "${mpirun[@]}" -np 2 "$bin" bench schedule --pp 4 --microbatches 3 --tf 1 --tb 1 \
  >"$tmp/out2" 2>&1
rc=$?
if [[ $rc -ne 2 ]] || ! grep -q -- "--pp 4: must equal the number of MPI ranks (2)" "$tmp/out2"; then
  echo "FAIL mismatch rc=$rc"; cat "$tmp/out2"; fail=1
else
  echo "ok   mismatch"
fi
exit $fail
