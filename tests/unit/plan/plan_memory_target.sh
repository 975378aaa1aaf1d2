#!/usr/bin/env bash
# The memory target on 4 ranks: with a limit below the memory of the search's
# unlimited first choice (a dense 1024-token model, where activations
# dominate), `trident plan --search --memory-gb` picks a mesh with recompute
# (and the sharded optimizer) that fits, and that mesh, run for 2 steps, has
# an allocator peak (/ranks/summary peak_alloc_bytes) within 10% of the
# predicted allocator bytes. Memory does not depend on the profile's rates.
set -euo pipefail
bin=${TRIDENT_BIN:?TRIDENT_BIN must point at the trident executable}
src=${TRIDENT_SOURCE_DIR:?TRIDENT_SOURCE_DIR must point at the source tree}
py=${TRIDENT_PYTHON:?TRIDENT_PYTHON must point at a python3 with h5py}
read -r -a mpirun <<<"${TRIDENT_MPIRUN:?TRIDENT_MPIRUN must hold the mpirun command}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/model.toml" <<'TOML'
[model]
vocab_size = 256
d_model = 128
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_hidden = 256
n_experts = 0
[data]
seq_len = 1024
micro_batch_size = 1
num_microbatches = 2
TOML
plan=("$bin" plan "$tmp/model.toml" --nodes 1 --devices-per-node 4
      --machine "$src/share/trident/machines/h100-sxm.toml" --search --top 1 --global-batch 8 --format json)
"${plan[@]}" >"$tmp/free.json"
limit=$("$py" -c 'import json,sys; print(0.4 * json.load(open(sys.argv[1]))["best"][0]["memory_bytes"]["total"] / 1e9)' "$tmp/free.json")
"${plan[@]}" --memory-gb "$limit" >"$tmp/limited.json"
"$py" - "$tmp/free.json" "$tmp/limited.json" "$limit" >"$tmp/sets" <<'PY'
import json, sys
free = json.load(open(sys.argv[1]))["best"][0]
b = json.load(open(sys.argv[2]))["best"][0]
limit = float(sys.argv[3]) * 1e9
assert free["memory_bytes"]["total"] > limit, free
assert b["memory_bytes"]["total"] <= limit, b
assert b["recompute"] != "none", b  # this limit needs recompute on every mesh
assert b["policy_effects"] and not b["policy_effects"][-1]["fits_without"], b
sets = {"parallel.pp": b["pp"], "parallel.cp": b["cp"], "parallel.vpp": b["vpp"],
        "parallel.schedule": b["schedule"], "parallel.cp_layout": b["cp_layout"],
        "parallel.cp_mode": b["cp_mode"], "parallel.cp_ulysses": b["cp_ulysses"] if b["cp_mode"] == "hybrid" else 0,
        "data.micro_batch_size": b["micro_batch_size"], "data.num_microbatches": b["num_microbatches"],
        "train.recompute": b["recompute"], "train.recompute_layers": b["recompute_layers"],
        "train.optimizer_sharding": b["optimizer_sharding"]}
print(" ".join(f"--set {k}={v}" for k, v in sets.items()), b["memory_bytes"]["allocator"])
PY
read -r -a args <<<"$(cut -d' ' -f1-24 "$tmp/sets")"
predicted=$(awk '{print $NF}' "$tmp/sets")
echo "search's choice under --memory-gb $limit: ${args[*]} (predicted allocator $predicted bytes)"
"${mpirun[@]}" -np 4 "$bin" run "$tmp/model.toml" --output "$tmp/run.h5" "${args[@]}" \
  --set train.steps=2 --set output.checkpoint_dir="$tmp/ckpt" >"$tmp/run.out"
"$py" - "$tmp/run.h5" "$predicted" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    peak = float(np.max(f["/ranks/summary"][()]["peak_alloc_bytes"]))
pred = float(sys.argv[2])
print(f"allocator peak: predicted {pred / 1e6:.3f} MB, measured {peak / 1e6:.3f} MB, ratio {pred / peak:.3f}")
assert abs(pred / peak - 1) <= 0.10, (pred, peak)
PY
