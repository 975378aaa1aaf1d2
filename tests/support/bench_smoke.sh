# Sourced by the `trident bench ...` smoke scripts: the binary, mpirun and
# python from ctest's environment, a temporary folder removed at exit, the
# verdict in $fail, and the checks they share.
set -u
bin=${TRIDENT_BIN:?}
read -r -a mpirun <<<"${TRIDENT_MPIRUN:?}"
py=${TRIDENT_PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

# The tiny dense model the one-process bench smokes run (bench gemm, step,
# attention): $tmp/tiny.toml, with any further sections from stdin.
write_tiny_config() {
  { cat <<'TOML'
[model]
vocab_size = 64
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_hidden = 96
n_experts = 0

[data]
task = "recall"
seq_len = 32
micro_batch_size = 2
num_microbatches = 2
TOML
    cat; } >"$tmp/tiny.toml"
}

# check_h5 FILE: runs the Python on stdin with the open file as `f`, after
# checking that it is a trident bench file.
check_h5() {
  local file=$1
  if [[ ! -f $file ]]; then
    echo "FAIL no $file"; fail=1; return
  fi
  { printf '%s\n' 'import sys, h5py' 'f = h5py.File(sys.argv[1], "r")' \
      'assert f.attrs["format"] in (b"trident-bench", "trident-bench"), f.attrs["format"]'; cat; } \
    >"$tmp/check.py"
  "$py" "$tmp/check.py" "$file" || fail=1
}

# expect_input_error TEXT CMD...: CMD must exit 2 with TEXT in its output.
expect_input_error() {
  local text=$1; shift
  timeout 60 "$@" >"$tmp/err" 2>&1
  local rc=$?
  if [[ $rc -ne 2 ]] || ! grep -q -- "$text" "$tmp/err"; then
    echo "FAIL ${*:2}: rc=$rc (want 2 naming '$text')"; cat "$tmp/err"; fail=1
  else
    echo "ok   '$text' -> exit 2"
  fi
}
