#!/usr/bin/env bash
# The verdict of scripts/gpu-check.sh on its test step, kept apart so that a
# machine without a GPU can check it (tests/unit/scripts/test_gpu_check_verdict.sh
# feeds it made-up transcripts: killed runs, missing tests, skips, failures).
#
#   scripts/gpu-check-verdict.sh MODE STATUS REGISTERED TRANSCRIPT
#
#   MODE        gpu (every test must pass) | dry-run (every test must SKIP)
#   STATUS      exit status of the test step (${PIPESTATUS[0]}); 124 or 137:
#               the step limit stopped it
#   REGISTERED  the number of tests registered (ctest -N; lines of the
#               carried tests.txt)
#   TRANSCRIPT  the step's output: ctest's result lines
#               ("  3/7 Test  #3: name ....   Passed   1.20 sec"), or the same
#               lines written by gpu-check.sh for carried binaries
#
# Prints one line, "tests: ...", and exits 0 when the verdict is a pass, 1
# when not, 2 on bad arguments. A test counts only through its result line:
# a run that ends early has fewer lines than tests registered, which fails
# whatever the lines say.
set -uo pipefail

if [[ $# -ne 4 ]]; then
  echo "gpu-check-verdict.sh: usage: MODE STATUS REGISTERED TRANSCRIPT" >&2
  exit 2
fi
mode=$1 status=$2 registered=$3 transcript=$4
case $mode in gpu | dry-run) ;; *)
  echo "gpu-check-verdict.sh: MODE must be gpu or dry-run, not '$mode'" >&2
  exit 2
  ;;
esac
for n in "$status" "$registered"; do
  if ! [[ $n =~ ^[0-9]+$ ]]; then
    echo "gpu-check-verdict.sh: STATUS and REGISTERED must be numbers, not '$n'" >&2
    exit 2
  fi
done
if [[ ! -r $transcript ]]; then
  echo "gpu-check-verdict.sh: cannot read the transcript $transcript" >&2
  exit 2
fi

result_line='^ *[0-9]+/[0-9]+ +Test +#[0-9]+: '
finished=$(grep -cE "$result_line" "$transcript")
passed=$(grep -E "$result_line" "$transcript" | grep -cE ' Passed +[0-9.]+ sec')
skipped=$(grep -E "$result_line" "$transcript" | grep -cE '\*\*\*Skipped')
failed=$((finished - passed - skipped))
counts="$passed passed, $failed failed, $skipped skipped of $registered registered"

verdict() {  # $1: 0 pass / 1 fail, $2: the line
  echo "tests: $2"
  exit "$1"
}
[[ $registered = 0 ]] && verdict 1 "none registered"
if [[ $status = 124 || $status = 137 ]]; then
  verdict 1 "stopped by the step limit after $finished of $registered ($counts)"
fi
if [[ $finished != "$registered" ]]; then
  verdict 1 "$finished of $registered reported a result, exit status $status ($counts)"
fi
if [[ $mode = dry-run ]]; then
  [[ $skipped = "$registered" && $status = 0 ]] &&
    verdict 0 "all $registered reported SKIP (no device), as a dry run expects"
  verdict 1 "$counts, exit status $status; a dry run expects every test to SKIP"
fi
[[ $passed = "$registered" && $status = 0 ]] && verdict 0 "all $registered passed"
note=""
[[ $skipped != 0 ]] && note=" (a skip on a GPU machine is a failure)"
verdict 1 "$counts, exit status $status$note"
