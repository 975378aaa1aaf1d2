#!/usr/bin/env bash
# Run file seen from outside: written under mpirun, then read with h5dump and
# h5py. Also a run killed by SIGKILL after 3 flushed steps must open in h5py
# with exactly 3 rows and completed = 0. Usage: run_file_script_test.sh WRITER SRC_DIR
set -u
writer=$1
here=$2
py=${TRIDENT_PYTHON:-python3}
read -r -a mpirun <<<"${TRIDENT_MPIRUN:?TRIDENT_MPIRUN is not set}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
step() { echo "== $*"; }
bad() { echo "FAILED: $*"; fail=1; }

if ! "$py" -c 'import h5py, numpy' 2>/dev/null; then
  echo "FAILED: $py cannot import h5py and numpy; run scripts/install-deps.sh (it makes .venv)" \
       "or set TRIDENT_PYTHON to a python3 that has them"
  exit 1
fi

for np in 1 3; do
  f=$tmp/run-np$np.h5
  step "write $f on $np ranks"
  timeout 60 "${mpirun[@]}" -np $np "$writer" "$f" --steps 5 || bad "writer on $np ranks exited $?"
  step "h5dump -H $f"
  if ! timeout 30 h5dump -H "$f" >"$tmp/dump.txt"; then
    bad "h5dump -H exit code"
  else
    for g in '/topology' '/topology/ranks' '/metrics' '/metrics/steps' '/metrics/comm_bytes' \
             '/metrics/expert_tokens' '/timeline' '/timeline/events' '/activations' \
             '/activations/step_1' '/activations/step_1/layer_0' '/activations/step_1/layer_0/q' \
             '/ranks' '/ranks/summary'; do
      name=${g##*/}
      grep -Eq "(GROUP|DATASET) \"$name\"" "$tmp/dump.txt" || bad "h5dump shows no $g"
    done
  fi
  step "h5py check of $f"
  "$py" "$here/check_run_file.py" run "$f" --ranks $np --steps 5 --completed 1 || bad "h5py check ($np ranks)"
done

f=$tmp/killed.h5
step "write $f on 2 ranks, SIGKILL after 3 steps"
timeout 60 "${mpirun[@]}" -np 2 "$writer" "$f" --steps 5 --kill-after-steps 3 >"$tmp/kill.log" 2>&1
rc=$?
cat "$tmp/kill.log" | head -5
[ $rc -ne 0 ] || bad "the killed writer exited 0"
grep -q "3 steps flushed, killing" "$tmp/kill.log" || bad "the writer did not reach the kill point"
timeout 30 h5dump -H "$f" >/dev/null || bad "h5dump -H cannot read the killed run's file"
"$py" "$here/check_run_file.py" run "$f" --ranks 2 --steps 3 --completed 0 || bad "h5py check of the killed run"

f=$tmp/bench.h5
step "bench file $f"
timeout 60 "${mpirun[@]}" -np 1 "$writer" --bench "$f" || bad "bench writer"
"$py" "$here/check_run_file.py" bench "$f" || bad "h5py check of the bench file"
[ ! -e "$f.tmp" ] || bad "bench temporary file left behind"

[ $fail -eq 0 ] && echo "run_file_script_test: passed"
exit $fail
