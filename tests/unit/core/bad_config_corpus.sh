#!/usr/bin/env bash
# Every tests/configs/bad/*.toml must make `trident plan` exit 2 with exactly
# one line on stderr that holds the file's `# expect:` text and names its key
# (`# key:` line; without one, some section.key). Usage: bad_config_corpus.sh DIR
set -u
dir=${1:?usage: bad_config_corpus.sh DIR}
bin=${TRIDENT_BIN:?TRIDENT_BIN must point at the trident executable}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

count=0
failed=0
for f in "$dir"/*.toml; do
  [ -e "$f" ] || continue
  count=$((count + 1))
  name=$(basename "$f")
  expect=$(sed -n '1s/^# expect: //p' "$f")
  key=$(sed -n 's/^# key: //p' "$f" | head -n1)
  if [ -z "$expect" ]; then
    echo "FAIL $name: first line must be '# expect: <substring of the error>'"
    failed=$((failed + 1))
    continue
  fi
  "$bin" plan "$f" --nodes 2 --devices-per-node 4 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  lines=$(wc -l <"$tmp/err")
  msg=$(cat "$tmp/err")
  problem=""
  if [ "$rc" -ne 2 ]; then
    problem="exit code $rc, expected 2"
  elif [ "$lines" -ne 1 ]; then
    problem="$lines lines on stderr, expected exactly 1"
  elif [ -s "$tmp/out" ]; then
    problem="wrote to stdout on failure"
  elif ! grep -qF -- "$expect" "$tmp/err"; then
    problem="message lacks '$expect'"
  elif [ -n "$key" ] && ! grep -qF -- "$key" "$tmp/err"; then
    problem="message does not name the key '$key'"
  elif [ -z "$key" ] && ! grep -qE '(model|data|parallel|train|runtime|output|topology)\.[a-z_0-9]+' "$tmp/err"; then
    problem="message names no section.key"
  fi
  if [ -n "$problem" ]; then
    echo "FAIL $name: $problem"
    echo "     stderr: $msg"
    failed=$((failed + 1))
  else
    echo "ok   $name: $msg"
  fi
done

if [ "$count" -lt 30 ]; then
  echo "FAIL: only $count bad configs in $dir (at least 30 expected)"
  exit 1
fi
echo "$((count - failed)) of $count bad configs rejected as expected"
[ "$failed" -eq 0 ]
