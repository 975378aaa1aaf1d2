#!/usr/bin/env bash
# A job with a bad config (a misspelt key) under sbatch: trident exits 2, the
# job's exit code is 2, its log holds trident's one-line message naming the
# key, and no run file is left behind.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
require_cluster
make_workdir bad_config

write_tiny_config "$WORK/bad.toml" 2
# A typo of d_model: unknown keys are errors (DESIGN.md "Config").
sed -i 's/^d_model = 32$/d_modle = 32/' "$WORK/bad.toml"
grep -q '^d_modle' "$WORK/bad.toml" || fail "could not write the bad config"

submit --job-name=t-badconfig --nodes=2 --ntasks-per-node=4 "$SBATCH_TEMPLATE" bad.toml
jid=$JOB
note "submitted job $jid"
wait_job "$jid" 180
state=$STATE
log=$WORK/trident-$jid.out
exit_code=$(job_field "$jid" ExitCode)
show_log "$log"
note "job $jid ended $state, exit code $exit_code"
[[ $exit_code == 2:0 ]] || fail "job exit code $exit_code, expected 2:0 (invalid input)"
[[ $state == FAILED ]] || fail "job state $state, expected FAILED"
grep -q '^trident.sbatch: trident exited with status 2$' "$log" || fail "the template did not see trident exit 2"

errors=$(grep -c '^trident: error:' "$log")
[[ $errors -eq 1 ]] || fail "expected exactly one 'trident: error:' line in the log, found $errors"
line=$(grep '^trident: error:' "$log")
grep -q 'd_modle' <<<"$line" || fail "the error line does not name the key d_modle: $line"
grep -q 'bad.toml' <<<"$line" || fail "the error line does not name the file bad.toml: $line"
[[ ! -e $WORK/trident-$jid.h5 ]] || fail "bad input left a run file trident-$jid.h5 behind"
note "PASS: $line"
