#!/usr/bin/env bash
# `trident bench ring` end to end under mpirun: outputs verified against the
# fp64 definition (#wrong = 0 is the exit code), both baselines, the
# --serialize-compute mode (ranks take turns computing), the HDF5 tables,
# every mode on the config's device (the emulated one), and a bad flag or
# config value as an input error. Sizes are tiny: behaviour, not speed.
source "$(dirname "${BASH_SOURCE[0]}")/../../support/bench_smoke.sh"

timeout 120 "${mpirun[@]}" -np 2 "$bin" bench ring --causal --baseline --seq-per-rank 64,128 \
  --iters 2 --output "$tmp/r2.h5" >"$tmp/out2" 2>&1 || { echo "FAIL np2 rc=$?"; cat "$tmp/out2"; fail=1; }
timeout 120 "${mpirun[@]}" -np 4 "$bin" bench ring --causal --seq-per-rank 64 --iters 2 \
  --serialize-compute --output "$tmp/r4.h5" >"$tmp/out4" 2>&1 || { echo "FAIL np4 rc=$?"; cat "$tmp/out4"; fail=1; }
grep -q -- '--serialize-compute: the ranks took turns' "$tmp/out4" || { echo "FAIL no serialize note"; fail=1; }
for f in "$tmp/out2" "$tmp/out4"; do
  grep -q '# wrong rows in total: 0 (OK)' "$f" || { echo "FAIL verdict in $f"; cat "$f"; fail=1; }
done
if [[ -f $tmp/r2.h5 && -f $tmp/r4.h5 ]]; then
  "$py" - "$tmp/r2.h5" "$tmp/r4.h5" <<'PY' || fail=1
import sys, h5py
for name, cases in ((sys.argv[1], 4), (sys.argv[2], 2)):
    g = h5py.File(name, "r")["bench/ring"]
    layouts = [x.decode() for x in g["layout"][:]]
    assert len(layouts) == cases, (name, layouts)
    for i, lay in enumerate(layouts):
        if lay == "zigzag":
            assert abs(g["balance_flops"][i] - 1.0) < 1e-9, g["balance_flops"][i]
        assert g["balance_cpu"][i] >= 1.0
g = h5py.File(sys.argv[1], "r")["bench/ring"]
assert (g["one_rank_busy_ms"][:] > 0).all() and (g["one_rank_alone_ms"][:] > 0).all()
# balance_paired is max/min of the ranks' compute_rel in the same case
for name in sys.argv[1:3]:
    f = h5py.File(name, "r")
    ring, ranks = f["bench/ring"], f["bench/ring_ranks"]
    case = lambda g, i: (g["layout"][i], g["seq"][i])
    for i in range(len(ring["layout"])):
        rel = [ranks["compute_rel"][j] for j in range(len(ranks["layout"]))
               if case(ranks, j) == case(ring, i)]
        assert len(rel) == len(set(ranks["rank"][:])) and min(rel) > 0, rel
        assert abs(ring["balance_paired"][i] - max(rel) / min(rel)) < 1e-9 * max(rel), (rel, ring["balance_paired"][i])
    assert (ranks["progress_ms"][:] >= 0).all()
    # ... and follows from the per-step rows (recomputed here on its own)
    steps = f["bench/ring_steps"]
    import collections, statistics
    t = collections.defaultdict(dict)  # (layout, seq) -> {(rank, it, step): ms}
    for j in range(len(steps["layout"])):
        t[(steps["layout"][j], steps["seq"][j])][
            (steps["rank"][j], steps["iteration"][j], steps["step"][j])] = steps["compute_ms"][j]
    for i in range(len(ring["layout"])):
        d = t[case(ring, i)]
        R = sorted({k[0] for k in d}); I = sorted({k[1] for k in d}); S = sorted({k[2] for k in d})
        assert len(S) == 2 * len(R) and len(d) == len(R) * len(I) * len(S)
        rel = dict.fromkeys(R, 0.0); total = 0.0
        for s in S:
            means = {it: sum(d[(r, it, s)] for r in R) / len(R) for it in I}
            w = statistics.median(means.values())
            if not w > 0: continue
            total += w
            for r in R:
                rel[r] += w * statistics.median(d[(r, it, s)] / means[it] if means[it] > 0 else 1.0 for it in I)
        paired = max(rel.values()) / min(rel.values())
        assert abs(paired - ring["balance_paired"][i]) < 1e-6, (paired, ring["balance_paired"][i])
# step kinds at cp=4, causal: each rank has one diagonal step per phase; the
# other 12 rank-steps split 6/6 between the two kinds of its layout
g = h5py.File(sys.argv[2], "r")["bench/ring_step_kinds"]
counts = {(g["layout"][j].decode(), g["phase"][j].decode(), g["kind"][j].decode()): g["steps"][j]
          for j in range(len(g["layout"]))}
for phase in ("forward", "backward"):
    assert counts[("zigzag", phase, "diagonal")] == 4, counts
    assert counts[("zigzag", phase, "2q x 1kv")] == 6 and counts[("zigzag", phase, "1q x 2kv")] == 6, counts
    assert counts[("contiguous", phase, "full")] == 6 and counts[("contiguous", phase, "masked")] == 6, counts
assert (g["median_ms"][:] >= 0).all()
print("ok   hdf5")
PY
else
  echo "FAIL missing HDF5 output"; fail=1
fi

# --cp-mode: the three modes side by side at cp=4 (u=2 for hybrid), verified
# rows, one row per (layout, mode), bytes each mode must send.
timeout 120 "${mpirun[@]}" -np 4 "$bin" bench ring --causal --seq-per-rank 32 --iters 2 \
  --heads 4 --kv-heads 2 --head-dim 16 --cp-mode ring,ulysses,hybrid --ulysses 2 \
  --output "$tmp/m4.h5" >"$tmp/outm" 2>&1 || { echo "FAIL modes rc=$?"; cat "$tmp/outm"; fail=1; }
grep -q '# wrong rows in total: 0 (OK)' "$tmp/outm" || { echo "FAIL modes verdict"; cat "$tmp/outm"; fail=1; }
if [[ -f $tmp/m4.h5 ]]; then
  "$py" - "$tmp/m4.h5" <<'PY' || fail=1
import sys, h5py
g = h5py.File(sys.argv[1], "r")["bench/cp_modes"]
rows = {(g["layout"][i].decode(), g["mode"][i].decode()): i for i in range(len(g["mode"]))}
assert len(rows) == 6, rows
L, H, Hkv, D, cp = 32, 4, 2, 16, 4
for lay in ("contiguous", "zigzag"):
    ring, uly, hyb = rows[(lay, "ring")], rows[(lay, "ulysses")], rows[(lay, "hybrid")]
    assert (g["u"][ring], g["ring"][ring]) == (1, 4)
    assert (g["u"][uly], g["ring"][uly]) == (4, 1)
    assert (g["u"][hyb], g["ring"][hyb]) == (2, 2)
    mib = lambda b: b / 1048576.0
    # ring: (3cp-2) K/V blocks of 2 L Hkv D floats
    assert abs(g["sent_MiB_per_rank"][ring] - mib((3 * cp - 2) * 2 * L * Hkv * D * 4)) < 1e-9
    # ulysses u=4: 3/4 of q,k,v,out,lse (F) and q,k,v,out,lse,dout,dq,dk,dv (B);
    # one K/V head per rank (Hkv < u)
    q, kv, lse = L * (H // 4) * D * 4, L * 1 * D * 4, L * (H // 4) * 4
    a2a = 3 * ((2 * q + 2 * kv + lse) + (4 * q + 4 * kv + lse))
    assert abs(g["sent_MiB_per_rank"][uly] - mib(a2a)) < 1e-9, (g["sent_MiB_per_rank"][uly], mib(a2a))
    assert g["ring_wait_ms"][uly] == 0
    for i in (ring, uly, hyb):
        assert g["wall_ms"][i] > 0 and g["compute_ms"][i] > 0 and 0 <= g["hidden"][i] <= 1
    assert g["a2a_ms"][ring] == 0 and g["a2a_ms"][uly] > 0 and g["a2a_ms"][hyb] > 0
print("ok   cp modes")
PY
else
  echo "FAIL missing cp-modes HDF5 output"; fail=1
fi

# --docs: packed documents against full causal at cp=4 (fixed lengths, so
# the FLOPs are known: 8 documents of 32 tokens), verified rows, and a
# window with lognormal lengths.
timeout 120 "${mpirun[@]}" -np 4 "$bin" bench ring --docs fixed:32 --seq-per-rank 64 --iters 1 \
  --heads 2 --head-dim 16 --output "$tmp/d4.h5" >"$tmp/outd" 2>&1 || { echo "FAIL docs rc=$?"; cat "$tmp/outd"; fail=1; }
grep -q '# wrong rows in total: 0 (OK)' "$tmp/outd" || { echo "FAIL docs verdict"; cat "$tmp/outd"; fail=1; }
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench ring --docs lognormal:20:1.5 --window 24 \
  --seq-per-rank 64 --layout zigzag >"$tmp/outw" 2>&1 || { echo "FAIL docs window rc=$?"; cat "$tmp/outw"; fail=1; }
grep -q '# wrong rows in total: 0 (OK)' "$tmp/outw" || { echo "FAIL docs window verdict"; cat "$tmp/outw"; fail=1; }
# several seeds: the causal ring once per layout, a summary per layout, and
# every rank's modelled tile work next to its compute
timeout 120 "${mpirun[@]}" -np 2 "$bin" bench ring --docs lognormal:16 --docs-seeds 3 --per-rank \
  --seq-per-rank 64 --layout all --heads 1 --head-dim 16 --output "$tmp/ds.h5" >"$tmp/outs" 2>&1 \
  || { echo "FAIL docs seeds rc=$?"; cat "$tmp/outs"; fail=1; }
grep -q '# wrong rows in total: 0 (OK)' "$tmp/outs" || { echo "FAIL docs seeds verdict"; cat "$tmp/outs"; fail=1; }
if [[ -f $tmp/ds.h5 ]]; then
  "$py" - "$tmp/ds.h5" <<'PY' || fail=1
import sys, h5py
f = h5py.File(sys.argv[1], "r")
t, s, r = f["bench/ring_docs"], f["bench/ring_docs_seeds"], f["bench/ring_docs_ranks"]
assert len(t["layout"]) == 3 * (1 + 3), len(t["layout"])
assert sorted(set(int(x) for x in t["seed"][:] if x)) == [1, 2, 3]
assert [x.decode() for x in s["layout"][:]] == ["contiguous", "zigzag", "docs"]
for i in range(3):
    sp = [t["speedup_time"][j] for j in range(len(t["layout"]))
          if t["layout"][j] == s["layout"][i] and t["mask"][j] == b"packed"]
    assert s["seeds"][i] == 3 and s["speedup_min"][i] == min(sp) and s["speedup_max"][i] == max(sp)
    assert s["speedup_min"][i] <= s["speedup_median"][i] <= s["speedup_max"][i]
assert len(r["rank"]) == 2 * 3 * (1 + 3)
# the model counts the same visible pairs as the ring's FLOP counter (1 head, D 16)
for j in range(len(t["layout"])):
    rows = [k for k in range(len(r["rank"])) if (r["layout"][k], r["mask"][k], r["seed"][k]) ==
            (t["layout"][j], t["mask"][j], t["seed"][j])]
    vis = sum(r["visible"][k] for k in rows)
    assert abs(vis * 14 * 16 - t["GFLOP_mean"][j] * 1e9 * 2) < 1e-3 * vis, (vis, t["GFLOP_mean"][j])
    assert all(r["computed"][k] >= r["visible"][k] and r["calls"][k] > 0 for k in rows)
print("ok   docs seeds")
PY
else
  echo "FAIL missing docs seeds HDF5 output"; fail=1
fi
if [[ -f $tmp/d4.h5 ]]; then
  "$py" - "$tmp/d4.h5" <<'PY' || fail=1
import sys, h5py
g = h5py.File(sys.argv[1], "r")["bench/ring_docs"]
rows = {(g["layout"][i].decode(), g["mask"][i].decode()): i for i in range(len(g["mask"]))}
assert len(rows) == 6, rows
seq, D, H = 256, 16, 2
pairs = lambda n: n * (n + 1) / 2
for lay in ("contiguous", "zigzag", "docs"):
    c, p = rows[(lay, "causal")], rows[(lay, "packed")]
    assert g["docs"][c] == 1 and g["docs"][p] == 8
    # mean over 4 ranks of 14 D H FLOPs per visible pair
    assert abs(g["GFLOP_mean"][c] * 1e9 * 4 - 14 * D * H * pairs(seq)) < 1e-3
    assert abs(g["GFLOP_mean"][p] * 1e9 * 4 - 14 * D * H * 8 * pairs(32)) < 1e-3
    assert g["flops_imbalance"][p] >= 1 and g["speedup_flops"][p] > 1
# 8 equal documents on 8 chunks of 32: the docs layout gives every rank the same work
assert abs(g["flops_imbalance"][rows[("docs", "packed")]] - 1) < 1e-12
print("ok   docs")
PY
else
  echo "FAIL missing docs HDF5 output"; fail=1
fi

# The ring, the modes and the packed rings on the config's device: on the
# emulated device a host access to their buffers would stop the process
# (exit 86), so these runs show that every buffer is on the device.
for args in "--causal --seq-per-rank 32 --iters 1 --heads 2 --head-dim 16 --layout zigzag" \
  "--causal --seq-per-rank 32 --heads 4 --kv-heads 2 --head-dim 16 --cp-mode ring,ulysses --layout zigzag" \
  "--docs lognormal:12 --window 24 --seq-per-rank 32 --heads 2 --head-dim 16 --layout docs"; do
  # shellcheck disable=SC2086
  timeout 120 "${mpirun[@]}" -np 2 "$bin" bench ring --set runtime.backend=emulated $args \
    >"$tmp/oute" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]] || ! grep -q '# wrong rows in total: 0 (OK)' "$tmp/oute"; then
    echo "FAIL emulated device ($args) rc=$rc"; cat "$tmp/oute"; fail=1
  else
    echo "ok   emulated device: $args"
  fi
done

expect_input_error "runtime.comm" "${mpirun[@]}" -np 2 "$bin" bench ring --set runtime.comm=bogus
expect_input_error "--layout" "${mpirun[@]}" -np 2 "$bin" bench ring --layout bogus
expect_input_error "--layout" "${mpirun[@]}" -np 2 "$bin" bench ring --layout docs
expect_input_error "--docs" "${mpirun[@]}" -np 2 "$bin" bench ring --docs zipf
expect_input_error "--docs" "${mpirun[@]}" -np 2 "$bin" bench ring --docs fixed:0
expect_input_error "--window" "${mpirun[@]}" -np 2 "$bin" bench ring --window 8
expect_input_error "--docs-seeds" "${mpirun[@]}" -np 2 "$bin" bench ring --docs fixed:8 --docs-seeds 0
expect_input_error "--per-rank" "${mpirun[@]}" -np 2 "$bin" bench ring --per-rank
expect_input_error "--cp-mode" "${mpirun[@]}" -np 2 "$bin" bench ring --cp-mode usp
exit $fail
