#!/usr/bin/env bash
# Activation capture with parallel.cp_layout = "docs" and packed documents:
# every sample has its own token order on the ring, and the run file must
# still hold q, k, v, attn_out and router_logits whole, in sequence order.
# `trident run` on cp = 4 against the same run on one rank, two steps
# (before and after one update), every captured dataset equal at 1e-4 and
# without a hole (a row that no rank placed stays NaN).
set -euo pipefail
bin=${TRIDENT_BIN:?TRIDENT_BIN must point at the trident executable}
py=${TRIDENT_PYTHON:?TRIDENT_PYTHON must point at a python3 with h5py}
read -r -a mpirun <<<"${TRIDENT_MPIRUN:?TRIDENT_MPIRUN must hold the mpirun command}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# Documents of long-tailed lengths (1 to about 60 tokens) ending in token 0.
"$py" - "$tmp/tokens.bin" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(11)
ids = []
while len(ids) < 6000:
    n = 1 + int(np.exp(2.0 + rng.standard_normal()))
    ids += list(rng.integers(1, 32, n - 1)) + [0]
np.array(ids, dtype=np.uint16).tofile(sys.argv[1])
PY
cat >"$tmp/cap.toml" <<TOML
[model]
vocab_size = 32
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_hidden = 48
n_experts = 4
top_k = 2
moe_every = 2
[data]
task = "tokens"
token_file = "$tmp/tokens.bin"
eod_token = 0
packing = "documents"
seq_len = 64
micro_batch_size = 2
num_microbatches = 2
[parallel]
cp = 4
cp_layout = "docs"
[train]
steps = 2
lr = 1e-2
warmup_steps = 1
[output]
timeline = false
activation_steps = [0, 1]
activation_layers = [0, 1]
activation_samples = [0, 3]
activations = ["q", "k", "v", "attn_out", "router_logits"]
[topology]
nodes = 1
devices_per_node = 4
nvlink_domain = 4
TOML
cd "$tmp"
"${mpirun[@]}" -np 4 "$bin" run cap.toml --output cp4.h5 >cp4.out 2>&1 || { cat cp4.out; fail "cp=4 run"; }
"${mpirun[@]}" -np 1 "$bin" run cap.toml --output one.h5 --set parallel.cp=1 \
  --set topology.devices_per_node=1 --set topology.nvlink_domain=1 >one.out 2>&1 \
  || { cat one.out; fail "1-rank run"; }
"$py" - cp4.h5 one.h5 <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
b["activations"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert len(names) == 2 * (2 * 4 + 1), names  # 2 steps: q, k, v, attn_out of 2 layers, router_logits of 1
for n in names:
    x, y = a["activations"][n][()], b["activations"][n][()]
    assert x.shape == y.shape, (n, x.shape, y.shape)
    assert not np.isnan(x).any(), f"{n}: rows no rank placed"
    err = np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)
    print(f"{n}: {x.shape}, max rel err {err:.2e}")
    assert err <= 1e-4, (n, err)
print("docs capture equals the 1-rank capture: ok")
PY
