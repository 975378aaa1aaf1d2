#!/usr/bin/env bash
# `trident plan --calibrate` on 2 ranks of a small model: writes a profile
# that `trident plan --machine` reads back, with positive rates, a measured
# link, an efficiency, no more cores than the machine has, shares of a core
# within 0..1, and the sharing figures it measured in its source; without --out
# it refuses with exit 2 and one line, and leaves no file.
set -euo pipefail
bin=${TRIDENT_BIN:?TRIDENT_BIN must point at the trident executable}
src=${TRIDENT_SOURCE_DIR:?TRIDENT_SOURCE_DIR must point at the source tree}
read -r -a mpirun <<<"${TRIDENT_MPIRUN:?TRIDENT_MPIRUN must hold the mpirun command}"
quick=$src/share/trident/examples/quickstart.toml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"${mpirun[@]}" -np 2 "$bin" plan "$quick" --calibrate --out "$tmp/m.toml" --set data.seq_len=64 >"$tmp/out"
cat "$tmp/out"
[ -f "$tmp/m.toml" ] || fail "no profile written"
[ ! -e "$tmp/m.toml.tmp" ] || fail "temporary file left behind"
python3 - "$tmp/m.toml" "$(nproc)" <<'PY'
import sys, tomllib
m = tomllib.load(open(sys.argv[1], "rb"))
c = m["compute"]
assert c["gemm_tflops"] > 0 and c["attention_tflops"] > 0 and c["memory_gb_per_s"] > 0, c
assert 0 < c["efficiency"] < 100, c
link = m["link"]["node"]
assert link["bandwidth_gb_per_s"] > 0 and link["latency_us"] > 0, link
# the step's gradient all-reduces at their own rate (2 ranks: measured), and
# the update timed with the node's ranks at once
assert 0 < link["collective_gb_per_s"] < 1e4, link
assert m["link"]["network"]["collective_gb_per_s"] == link["collective_gb_per_s"], m["link"]
assert c["optimizer_ns_per_param"] > 0, c
mach = m["machine"]
assert 0 <= mach["cores_per_node"] <= int(sys.argv[2]), mach
assert 0 <= mach.get("wait_core_share", 0) <= 1, mach
assert 0 < mach.get("time_slice_efficiency", 1) <= 1, mach
assert "ranks ran at once" in mach["source"], mach
o = m["overhead"]
# what a whole step costs beyond its priced work, and the step's small all-reduces
assert o["step_us"] >= 0 and o["layer_us"] >= 0, o
assert 0 < o["collective_round_us"] < 1e6, o
# a blocking ring step and all-to-all between computing ranks, beyond their bytes
assert 0 <= o["ring_step_us"] < 1e6 and 0 <= o["alltoall_us"] < 1e6, o
print("calibrated profile: ok")
PY
"$bin" plan "$quick" --nodes 1 --devices-per-node 8 --machine "$tmp/m.toml" | grep -q "^prediction for" \
  || fail "the calibrated profile does not predict"
set +e
"${mpirun[@]}" -np 2 "$bin" plan "$quick" --calibrate >"$tmp/o2" 2>"$tmp/e2"
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--calibrate without --out exited $rc"
grep -qF -- "--calibrate: needs --out FILE" "$tmp/e2" "$tmp/o2" || fail "no one-line refusal: $(cat "$tmp/e2")"
echo "plan calibrate: ok"
