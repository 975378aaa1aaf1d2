#!/usr/bin/env bash
# scripts/gpu-check-verdict.sh on made-up test transcripts: the cases a GPU
# session can meet, each with the verdict it must give. The first of them is
# the defect this guards against: ctest killed by the step limit after some
# tests had passed was reported as PASS. Runs anywhere (no GPU, no build);
# gpu-check.sh --dry-run runs it too.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
verdict=$here/../../../scripts/gpu-check-verdict.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# line N TOTAL NAME RESULT: one ctest result line
line() {
  case $4 in
    pass) printf '%3d/%d Test #%d: %s ......   Passed    1.25 sec\n' "$1" "$2" "$1" "$3" ;;
    skip) printf '%3d/%d Test #%d: %s ......***Skipped   0.02 sec\n' "$1" "$2" "$1" "$3" ;;
    fail) printf '%3d/%d Test #%d: %s ......***Failed    0.50 sec\n' "$1" "$2" "$1" "$3" ;;
    timeout) printf '%3d/%d Test #%d: %s ......***Timeout  60.01 sec\n' "$1" "$2" "$1" "$3" ;;
    abort) printf '%3d/%d Test #%d: %s ......Subprocess aborted***Exception:   0.30 sec\n' \
      "$1" "$2" "$1" "$3" ;;
  esac
}

# expect NAME WANT_RC WANT_TEXT MODE STATUS REGISTERED RESULTS...
# RESULTS: one word per finished test (pass, skip, fail, timeout, abort).
expect() {
  local name=$1 want_rc=$2 want_text=$3 mode=$4 status=$5 registered=$6
  shift 6
  local t=$work/$name.log i=0
  {
    echo "Test project /somewhere/build-gpu"
    for r in "$@"; do
      i=$((i + 1))
      echo "    Start $i: test_$i"
      line "$i" "$registered" "test_$i" "$r"
    done
  } > "$t"
  local out rc
  out=$(bash "$verdict" "$mode" "$status" "$registered" "$t")
  rc=$?
  if [[ $rc != "$want_rc" || $out != *"$want_text"* || $(wc -l <<< "$out") != 1 ]]; then
    echo "FAIL $name: exit $rc, '$out' (want exit $want_rc and one line with '$want_text')"
    failures=$((failures + 1))
  else
    echo "ok   $name: $out"
  fi
}

# A GPU session.
expect killed_after_passes 1 "stopped by the step limit after 3 of 7" gpu 124 7 pass pass pass
expect killed_hard 1 "stopped by the step limit" gpu 137 7 pass pass pass pass pass pass pass
expect all_passed 0 "all 7 passed" gpu 0 7 pass pass pass pass pass pass pass
expect fewer_lines_than_registered 1 "5 of 7 reported a result" gpu 0 7 pass pass pass pass pass
expect one_failed 1 "6 passed, 1 failed, 0 skipped of 7" gpu 8 7 pass pass fail pass pass pass pass
expect one_timed_out 1 "1 failed" gpu 8 3 pass timeout pass
expect one_aborted 1 "1 failed" gpu 8 3 pass abort pass
expect skip_on_gpu 1 "a skip on a GPU machine is a failure" gpu 0 3 pass skip pass
expect passed_but_status 1 "exit status 8" gpu 8 2 pass pass
expect none_registered 1 "none registered" gpu 0 0
# A dry run on a machine without a GPU.
expect dry_all_skip 0 "all 4 reported SKIP" dry-run 0 4 skip skip skip skip
expect dry_one_passed 1 "a dry run expects every test to SKIP" dry-run 0 3 skip pass skip
expect dry_killed 1 "stopped by the step limit" dry-run 124 4 skip skip
expect dry_missing 1 "2 of 4 reported a result" dry-run 0 4 skip skip

# Bad arguments: exit 2 with a line on stderr.
touch "$work/empty.log"
for args in "gpu x 3 $work/empty.log" "cpu 0 3 $work/empty.log" "gpu 0 3 $work/missing.log" "gpu 0"; do
  # shellcheck disable=SC2086
  bash "$verdict" $args > /dev/null 2>&1
  rc=$?
  if [[ $rc != 2 ]]; then
    echo "FAIL bad arguments '$args': exit $rc (want 2)"
    failures=$((failures + 1))
  fi
done

if [[ $failures != 0 ]]; then
  echo "$failures verdict case(s) wrong"
  exit 1
fi
echo "every verdict case right"
