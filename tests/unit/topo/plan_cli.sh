#!/usr/bin/env bash
# `trident plan`: the quickstart on 2 nodes x 4 devices puts CP pairs inside a
# node and the two stages on different nodes; a 1024 x 8 plan lists groups
# that obey the placement rules; bad flags exit 2 with one line.
set -euo pipefail
bin=${TRIDENT_BIN:?TRIDENT_BIN must point at the trident executable}
src=${TRIDENT_SOURCE_DIR:?TRIDENT_SOURCE_DIR must point at the source tree}
quick=$src/share/trident/examples/quickstart.toml
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# --- quickstart, text ---
"$bin" plan "$quick" --nodes 2 --devices-per-node 4 >"$tmp/q.txt"
cat "$tmp/q.txt"
grep -qF "stage 0: ranks 0-3 on node 0" "$tmp/q.txt" || fail "stage 0 is not on node 0"
grep -qF "stage 1: ranks 4-7 on node 1" "$tmp/q.txt" || fail "stage 1 is not on node 1"
grep -qF "[0 1]@node0 [2 3]@node0 [4 5]@node1 [6 7]@node1" "$tmp/q.txt" || fail "CP pairs are not inside a node"

# --- quickstart, json: the same facts, checked from the rank numbers ---
"$bin" plan "$quick" --nodes 2 --devices-per-node 4 --format json >"$tmp/q.json"
python3 - "$tmp/q.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
m = p["mesh"]
G = m["devices_per_node"]
assert (m["pp"], m["dp"], m["cp"], m["ep"]) == (2, 2, 2, 2), m
cp = m["groups"]["cp"]["list"]
assert len(cp) == 4 and all(len(g) == 2 for g in cp), cp
for g in cp:
    assert len({r // G for r in g}) == 1, f"CP pair {g} spans nodes"
stage_nodes = []
for pp_group in m["groups"]["pp"]["list"]:
    nodes = [r // G for r in pp_group]
    assert len(set(nodes)) == len(nodes), f"stages of {pp_group} share a node"
for s in m["stages"]:
    stage_nodes.append((s["first_node"], s["last_node"]))
assert stage_nodes == [(0, 0), (1, 1)], stage_nodes
for g in m["groups"]["ep"]["list"]:
    assert len({r // G for r in g}) == 1, f"EP group {g} spans nodes"
assert p["global_batch"] == 2 * 4 * 2 and p["layers_per_chunk"] == 2
print("quickstart json: ok")
PY

# --- 1024 nodes x 8 devices, every group listed, checked rank by rank ---
big=(--nodes 1024 --devices-per-node 8 --nvlink-domain 4 --set parallel.pp=8 --set parallel.cp=4
     --set parallel.ep=8 --set model.n_experts=64 --set model.n_layers=16 --set data.seq_len=4096
     --set data.num_microbatches=16)
"$bin" plan "$quick" "${big[@]}" --groups --format json >"$tmp/big.json"
python3 - "$tmp/big.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["mesh"]
G, D, W = m["devices_per_node"], m["nvlink_domain"], m["world"]
pp, dp, cp, ep = m["pp"], m["dp"], m["cp"], m["ep"]
assert W == 8192 and pp * dp * cp == W and (pp, cp, ep) == (8, 4, 8)
for kind, g in m["groups"].items():
    assert g["complete"] and len(g["list"]) == g["count"], kind
    seen = sorted(r for grp in g["list"] for r in grp)
    assert seen == list(range(W)), f"{kind} groups do not partition the world"
for g in m["groups"]["cp"]["list"]:
    assert len(g) == cp and len({r // D for r in g}) == 1, f"CP group {g} leaves its NVLink domain"
for g in m["groups"]["ep"]["list"]:
    assert len(g) == ep and len({r // G for r in g}) == 1, f"EP group {g} spans nodes"
stage = W // pp
for s in m["stages"]:
    # pp < nodes: every stage is whole nodes, and no two stages share one.
    assert s["first_rank"] % G == 0 and (s["last_rank"] + 1) % G == 0, s
for g in m["groups"]["pp"]["list"]:
    assert len({r // G for r in g}) == pp, f"stages of {g} share a node"
print("1024x8 json: ok")
PY

# Without --groups the huge plan stays short.
"$bin" plan "$quick" "${big[@]}" >"$tmp/big.txt"
lines=$(wc -l <"$tmp/big.txt")
[ "$lines" -lt 40 ] || fail "1024x8 summary has $lines lines"
grep -qF "more (--groups lists all)" "$tmp/big.txt" || fail "1024x8 summary does not say it is truncated"

# --- bad flags and impossible meshes: exit 2, one line ---
expect_input_error() {  # expect_input_error SUBSTRING ARGS...
  local want=$1; shift
  set +e
  "$bin" plan "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "plan $* exited $rc, expected 2"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "plan $* printed $(wc -l <"$tmp/err") lines on stderr"
  grep -qF -- "$want" "$tmp/err" || fail "plan $*: '$(cat "$tmp/err")' lacks '$want'"
  echo "ok: $(cat "$tmp/err")"
}
expect_input_error "--nvlink-domain 3: must divide --devices-per-node 4" "$quick" --nodes 2 --devices-per-node 4 --nvlink-domain 3
expect_input_error "--format yaml: must be text or json" "$quick" --nodes 2 --devices-per-node 4 --format yaml
expect_input_error "--nodes 0: must be >= 1" "$quick" --nodes 0 --devices-per-node 4
expect_input_error "cannot open the config file" "$tmp/missing.toml" --nodes 2 --devices-per-node 4
expect_input_error "--set parallel.cp=4: a CP group must lie inside one NVLink domain of 2 ranks" \
  "$quick" --nodes 2 --devices-per-node 4 --nvlink-domain 2 --set parallel.cp=4
expect_input_error "a mapping that fits is pp=2 cp=2" \
  "$quick" --nodes 2 --devices-per-node 4 --nvlink-domain 2 --set parallel.cp=4
expect_input_error "quickstart.toml:22: parallel.pp: world size 6 must be divisible by parallel.pp*parallel.cp" \
  "$quick" --nodes 3 --devices-per-node 2 --set model.n_layers=6
echo "plan cli: ok"
