#!/usr/bin/env bash
# `trident bench gemm`, `trident bench step` and `trident bench attention
# --dtype f32,bf16` end to end (one process each):
# every row checked (#wrong = 0, the exit code), the HDF5 file holds the
# printed tables, the bf16 rows name the path this host runs (native only
# where /proc/cpuinfo has avx512_bf16; TRIDENT_CPU_BF16=staged names staged
# everywhere), bench step's bf16_staged and bf16_native variants alternate in
# one process and each names its own path (bf16_native only on AVX512-BF16;
# elsewhere it is an input error), and bad flags are input errors (exit 2,
# one line). Sizes are tiny: this checks behaviour, not speed.
source "$(dirname "${BASH_SOURCE[0]}")/../../support/bench_smoke.sh"
export OPENBLAS_NUM_THREADS=1
write_tiny_config <<'TOML'
[train]
steps = 10
lr = 3e-3
warmup_steps = 2
TOML
if grep -qw avx512_bf16 /proc/cpuinfo; then want="native (AVX512-BF16)"; else want="staged (no AVX512-BF16)"; fi

# check_table OUT FILE TABLE FIRST_COLUMN BF16_PATH [STAGED_PATH]: the printed
# rows of TABLE (those after its header line) are the file's, every #wrong is
# 0, every bf16 row's path is BF16_PATH, a bf16_staged row's STAGED_PATH and a
# bf16_native row's native.
check_table() {
  "$py" - "${@:1:5}" "${6:-}" <<'PY' || fail=1
import sys, h5py
out, path, name, first, bf16_path, staged_path = sys.argv[1:]
lines = open(out).read().splitlines()
head = next(i for i, l in enumerate(lines) if l.startswith("#") and l.split()[1:2] == [first])
rows = []
for l in lines[head + 1:]:
    if not l.startswith("   "):
        break
    rows.append(l)
with h5py.File(path, "r") as f:
    g = f["bench/" + name]
    cols = [c.decode() if isinstance(c, bytes) else c for c in g.attrs["columns"]]
    assert cols == lines[head].split()[1:], (cols, lines[head])
    assert int(g.attrs["rows"]) == len(rows) > 0, (g.attrs["rows"], len(rows))
    assert (g["#wrong"][:] == 0).all(), g["#wrong"][:]
    dt = [x.decode() for x in g["dtype" if "dtype" in cols else "precision"][:]]
    paths = [x.decode() for x in g["path"][:]]
    for d, p, row in zip(dt, paths, rows):
        assert d in row and p in row, (d, p, row)
        if d == "bf16":
            assert p == bf16_path, (p, bf16_path)
        if d == "bf16_staged":
            assert p == staged_path, (p, staged_path)
        if d == "bf16_native":
            assert p == "native (AVX512-BF16)", p
print("ok   " + name + ": %d rows, file = printed" % len(rows))
PY
}

# Input errors: one line naming the flag, exit 2.
expect_one_line_error() {
  expect_input_error "$@"
  [[ $(wc -l <"$tmp/err") -eq 1 ]] || { echo "FAIL more than one line: ${*:2}"; cat "$tmp/err"; fail=1; }
}

timeout 120 "$bin" bench gemm "$tmp/tiny.toml" --sizes 40 --reps 1 --output "$tmp/g.h5" >"$tmp/g.out" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then echo "FAIL bench gemm rc=$rc"; cat "$tmp/g.out"; fail=1; fi
grep -q '# wrong rows in total: 0 (OK)' "$tmp/g.out" || { echo "FAIL gemm verdict"; fail=1; }
check_table "$tmp/g.out" "$tmp/g.h5" gemm layer "$want"
# the model's layers and the square size, every op
for layer in "wq,wo" "wk,wv" "ffn gate,up" "ffn down" "lm_head" "40\\^3"; do
  for op in forward input_grad weight_grad; do
    grep -qE "^ +$layer +$op " "$tmp/g.out" || { echo "FAIL no row $layer $op"; fail=1; }
  done
done

# A peer's rows beside trident's (share/trident/benchmarks/bench_table.py, the
# torch-*.py scripts' --bench-h5): appended run by run, read by trident-analyze.
TRIDENT_SOURCE_DIR=${TRIDENT_SOURCE_DIR:?} "$py" - "$tmp/g.h5" <<'PY' || { echo "FAIL bench_table.py"; fail=1; }
import os, sys
src = os.environ["TRIDENT_SOURCE_DIR"]
sys.path[:0] = [src + "/share/trident/benchmarks", src + "/share/trident/analysis"]
from bench_table import add_table
from trident_analyze.bench import read_bench
cols = ["precision", "path", "steps", "cpu_s", "GFLOP/s"]
for p in ("fp32", "bf16"):
    add_table(sys.argv[1], "torch_step", "peer", cols, [[p, "torch", 4, 1.5, 80.0]], ["a note"])
b = read_bench(sys.argv[1])
t = b["tables"]["torch_step"]
assert t["columns"] == cols and [r[0] for r in t["rows"]] == ["fp32", "bf16"], t
assert t["rows"][0][2:] == [4, 1.5, 80.0] and t["notes"] == ["a note"], t
assert len(b["tables"]["gemm"]["rows"]) == 36
print("ok   bench_table.py: torch_step beside gemm, 2 rows appended")
PY

TRIDENT_CPU_BF16=staged timeout 120 "$bin" bench gemm --sizes 24 --ops forward --reps 1 \
  --output "$tmp/gs.h5" >"$tmp/gs.out" 2>&1 || { echo "FAIL gemm staged"; cat "$tmp/gs.out"; fail=1; }
want_staged="staged (no AVX512-BF16)"
grep -qw avx512_bf16 /proc/cpuinfo && want_staged="staged (TRIDENT_CPU_BF16=staged)"
check_table "$tmp/gs.out" "$tmp/gs.h5" gemm layer "$want_staged"

timeout 120 "$bin" bench step "$tmp/tiny.toml" --steps 2 --output "$tmp/s.h5" >"$tmp/s.out" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then echo "FAIL bench step rc=$rc"; cat "$tmp/s.out"; fail=1; fi
grep -q '# steps not finite or not applied in total: 0 (OK)' "$tmp/s.out" ||
  { echo "FAIL step verdict"; cat "$tmp/s.out"; fail=1; }
check_table "$tmp/s.out" "$tmp/s.h5" step precision "$want"

# Staged and native bf16 alternating in one process (kernels::set_cpu_bf16_path).
if grep -qw avx512_bf16 /proc/cpuinfo; then
  variants=fp32,bf16_staged,bf16_native,bf16; chosen="staged (chosen at run time)"
else
  variants=fp32,bf16_staged,bf16; chosen="staged (no AVX512-BF16)"
  expect_one_line_error "--precision bf16_native: " "$bin" bench step "$tmp/tiny.toml" \
    --precision fp32,bf16_native
fi
timeout 180 "$bin" bench step "$tmp/tiny.toml" --steps 2 --precision $variants \
  --output "$tmp/sp.h5" >"$tmp/sp.out" 2>&1 || { echo "FAIL bench step $variants"; cat "$tmp/sp.out"; fail=1; }
check_table "$tmp/sp.out" "$tmp/sp.h5" step precision "$want" "$chosen"
[[ $(grep -cE '^ +(fp32|bf16|bf16_staged|bf16_native) ' "$tmp/sp.out") -eq $(tr , '\n' <<<"$variants" | wc -l) ]] ||
  { echo "FAIL bench step: not one row per variant ($variants)"; cat "$tmp/sp.out"; fail=1; }

timeout 120 "$bin" bench attention --seq 64,100 --head-dim 16 --heads 2 --mask causal,full \
  --dtype f32,bf16 --reps 1 --output "$tmp/a.h5" >"$tmp/a.out" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then echo "FAIL bench attention --dtype rc=$rc"; cat "$tmp/a.out"; fail=1; fi
check_table "$tmp/a.out" "$tmp/a.h5" attention_dtype mask "$want"
[[ $(grep -cE '^ +(causal|full) +(64|100) +16 +(f32|bf16) ' "$tmp/a.out") -eq 8 ]] ||
  { echo "FAIL attention_dtype: not 8 rows"; cat "$tmp/a.out"; fail=1; }

expect_one_line_error "--dtype f16" "$bin" bench gemm --sizes 8 --dtype f32,f16
expect_one_line_error "--ops" "$bin" bench gemm --sizes 8 --ops fwd
expect_one_line_error "--reps" "$bin" bench gemm --sizes 8 --reps 0
expect_one_line_error "--sizes" "$bin" bench gemm
expect_one_line_error "--sizes" "$bin" bench gemm --sizes 8,-1
expect_one_line_error "--tokens 16: needs a config" "$bin" bench gemm --sizes 8 --tokens 16
expect_one_line_error "--precision fp16" "$bin" bench step "$tmp/tiny.toml" --precision fp16
expect_one_line_error "--dtype f16" "$bin" bench attention --seq 64 --head-dim 16 --dtype f16
expect_one_line_error "--steps" "$bin" bench step "$tmp/tiny.toml" --steps 0
expect_one_line_error "bench step runs the model on one rank" "$bin" bench step \
  "${TRIDENT_SOURCE_DIR:?}/share/trident/examples/quickstart.toml" --steps 1
exit $fail
