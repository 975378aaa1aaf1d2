#!/usr/bin/env bash
# runtime.backend at the command line: "cuda" where the build has no CUDA
# backend or the rank sees no device exits 2 with one line naming
# runtime.backend and leaves no run file; where a device is there, the run
# records backend = "cuda". "cpu" runs and records backend = "cpu" in the
# run file's root attributes.
set -u
bin=${TRIDENT_BIN:?TRIDENT_BIN must point at the trident executable}
mpirun=${TRIDENT_MPIRUN:?TRIDENT_MPIRUN must hold the mpirun command line}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/small.toml" <<'TOML'
[model]
vocab_size = 32
d_model = 32
n_layers = 2
n_heads = 2
n_kv_heads = 2
ffn_hidden = 64
n_experts = 0
[data]
seq_len = 32
micro_batch_size = 1
num_microbatches = 1
[train]
steps = 1
[output]
timeline = false
TOML
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }
backend_attr() { h5dump -a /backend "$1" | sed -n 's/^ *(0): "\(.*\)"$/\1/p'; }

$mpirun -np 1 "$bin" run small.toml --set runtime.backend=cpu --set output.checkpoint_dir=ck \
  --output cpu.h5 >out 2>err || fail "backend=cpu: exit $? ($(cat err))"
[ "$(backend_attr cpu.h5)" = cpu ] || fail "backend=cpu: run file attribute backend is '$(backend_attr cpu.h5)'"
echo "ok   backend=cpu runs and records backend = cpu"

$mpirun -np 1 "$bin" run small.toml --set runtime.backend=cuda --set output.checkpoint_dir=ck \
  --output cuda.h5 >out 2>err
rc=$?
if [ "$rc" -eq 0 ]; then
  [ "$(backend_attr cuda.h5)" = cuda ] || fail "backend=cuda ran but recorded '$(backend_attr cuda.h5)'"
  echo "ok   backend=cuda: a device is visible; the run recorded backend = cuda"
  exit 0
fi
msg=$(grep -v '^-\|^$\|mpirun\|Primary job\|process\|non-zero\|Process name\|Exit code\|terminated\|aborted\|^ ' err)
[ "$rc" -eq 2 ] || fail "backend=cuda: exit $rc, expected 2 ($(cat err))"
[ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] || fail "backend=cuda: expected one line, got: $msg"
printf '%s\n' "$msg" | grep -q 'runtime.backend' || fail "backend=cuda: message does not name runtime.backend: $msg"
[ ! -e cuda.h5 ] || fail "backend=cuda: a run file was written"
echo "ok   backend=cuda refused: $msg"
