#!/usr/bin/env bash
# `trident run --machine` with packed documents records the prediction that
# `trident plan --machine` makes for the same config and mesh: attention
# priced from the data's document-length histogram (the same step time and
# forward time), which is below the causal pricing of the same data unpacked.
set -euo pipefail
bin=${TRIDENT_BIN:?TRIDENT_BIN must point at the trident executable}
src=${TRIDENT_SOURCE_DIR:?TRIDENT_SOURCE_DIR must point at the source tree}
py=${TRIDENT_PYTHON:?TRIDENT_PYTHON must point at a python3 with h5py}
read -r -a mpirun <<<"${TRIDENT_MPIRUN:?TRIDENT_MPIRUN must hold the mpirun command}"
machine=$src/share/trident/machines/h100-sxm.toml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Documents of 1..60 tokens ending in token 0 (uint16 ids below 32).
"$py" - "$tmp/tokens.bin" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(7)
ids = []
while len(ids) < 40000:
    n = int(rng.integers(1, 60))
    ids += list(rng.integers(1, 32, n - 1)) + [0]
np.array(ids, dtype=np.uint16).tofile(sys.argv[1])
PY
cat >"$tmp/packed.toml" <<TOML
[model]
vocab_size = 32
d_model = 32
n_layers = 2
n_heads = 2
n_kv_heads = 2
ffn_hidden = 64
n_experts = 0
[data]
task = "tokens"
token_file = "$tmp/tokens.bin"
eod_token = 0
packing = "documents"
seq_len = 256
micro_batch_size = 1
num_microbatches = 1
[parallel]
cp = 2
[train]
steps = 1
[output]
timeline = false
[topology]
nodes = 1
devices_per_node = 2
nvlink_domain = 2
TOML
(cd "$tmp" && "${mpirun[@]}" -np 2 "$bin" run "$tmp/packed.toml" --machine "$machine" \
   --output "$tmp/run.h5" >"$tmp/run.out") || { cat "$tmp/run.out"; fail "trident run"; }
plan=("$bin" plan "$tmp/packed.toml" --nodes 1 --devices-per-node 2 --nvlink-domain 2
      --machine "$machine" --format json)
"${plan[@]}" >"$tmp/packed.json"
"${plan[@]}" --set data.packing=none >"$tmp/causal.json"
"$py" - "$tmp/run.h5" "$tmp/packed.json" "$tmp/causal.json" <<'PY'
import json, sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    a = f.attrs["prediction"]
run = json.loads(a.decode() if isinstance(a, bytes) else a)
packed = json.load(open(sys.argv[2]))["prediction"]
causal = json.load(open(sys.argv[3]))["prediction"]
for k in ("t_f_s", "t_b_s", "step_time_s"):
    print(f"{k}: run {run[k]:.6g}, plan packed {packed[k]:.6g}, plan causal {causal[k]:.6g}")
    assert abs(run[k] - packed[k]) <= 1e-9 * packed[k], (k, run[k], packed[k])
assert packed["t_f_s"] < causal["t_f_s"], (packed["t_f_s"], causal["t_f_s"])
print("run --machine prices packed attention: ok")
PY
