#!/usr/bin/env bash
# `trident schedule` end to end: simulate prints the timeline, export/import
# round-trips, and broken hand-written schedules exit 2 naming the actions.
set -u
data=$1
bin=${TRIDENT_BIN:?TRIDENT_BIN not set}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {  # check NAME EXPECTED_RC SUBSTRING -- command...
  local name=$1 want_rc=$2 want=$3
  shift 4
  "$@" >"$tmp/out" 2>&1
  local rc=$?
  if [[ $rc -ne $want_rc ]] || ! grep -qF -- "$want" "$tmp/out"; then
    echo "FAIL $name: rc=$rc (want $want_rc), output lacks '$want':"
    cat "$tmp/out"
    fail=1
  else
    echo "ok   $name"
  fi
}

check simulate 0 "rank 3 |.  .  .  F0 B0 B0 B0 F1" -- \
  "$bin" schedule 1f1b --pp 4 --microbatches 8 --simulate
check makespan 0 "makespan 44," -- "$bin" schedule 1f1b --pp 4 --microbatches 8 --simulate
check export 0 "wrote $tmp/zb.csv" -- \
  "$bin" schedule zb-h1 --pp 3 --microbatches 5 --export "$tmp/zb.csv"
"$bin" schedule zb-h1 --pp 3 --microbatches 5 --simulate | grep makespan >"$tmp/gen"
check import 0 "$(cat "$tmp/gen")" -- "$bin" schedule --import "$tmp/zb.csv" --simulate
check import_lists 0 "rank 2: 2RECV_F0 2F0 2B0 2SEND_B0" -- "$bin" schedule --import "$tmp/zb.csv"
check handwritten 0 "makespan" -- "$bin" schedule --import "$data/handwritten_ok.csv" --simulate
check deadlock 2 "rank 0 waits at 0RECV_B0 for 1SEND_B0" -- \
  "$bin" schedule --import "$data/deadlock.csv" --simulate --export "$tmp/dead_out.csv"
if [[ -e $tmp/dead_out.csv ]]; then echo "FAIL deadlock left $tmp/dead_out.csv"; fail=1; fi
check deadlock_other_side 2 "rank 1 waits at 1RECV_F1 for 0SEND_F1" -- \
  "$bin" schedule --import "$data/deadlock.csv"
check missing_b 2 "0B1 is missing" -- "$bin" schedule --import "$data/missing_b.csv" --simulate
check no_microbatches 2 "--microbatches 0" -- \
  "$bin" schedule interleaved --pp 4 --vpp 2 --microbatches 0
check interleaved_any_m 0 "closed form (p-1)/(v*m) = 0.2143" -- \
  "$bin" schedule interleaved --pp 4 --vpp 2 --microbatches 7 --simulate
check zb_v 0 "makespan 51, mean bubble 0.0588" -- \
  "$bin" schedule zb-v --pp 4 --microbatches 8 --simulate --tf 1 --tb 1 --tw 1
check dualpipev 0 "makespan 51, mean bubble 0.0588" -- \
  "$bin" schedule dualpipev --pp 4 --microbatches 8 --simulate --tf 1 --tb 1 --tw 1
check dualpipev_few 2 "--microbatches 7: schedule 'dualpipev' with pp=4 vpp=2 needs at least 8" -- \
  "$bin" schedule dualpipev --pp 4 --microbatches 7
check zb_v_vpp 2 "needs --vpp 2" -- "$bin" schedule zb-v --pp 4 --vpp 3 --microbatches 8
check vpp_needs_interleaved 2 "--vpp 2" -- "$bin" schedule 1f1b --pp 4 --vpp 2 --microbatches 8
check unknown 2 "gpipe2" -- "$bin" schedule gpipe2 --pp 4 --microbatches 8
check negative_cost 2 "--tb" -- "$bin" schedule 1f1b --pp 2 --microbatches 2 --tb -1 --simulate
check unwritable 2 "--export" -- \
  "$bin" schedule 1f1b --pp 2 --microbatches 2 --export /nonexistent-dir/x.csv
check missing_file 2 "--import" -- "$bin" schedule --import "$tmp/none.csv"
# PyTorch's format: its files import (FSDP and WAIT_SEND cells noted), trident's
# export reads back, and a cell it cannot take is refused naming it.
check torch_comms 0 "ignored 16 FSDP cells" -- \
  "$bin" schedule --import "$data/torch/torch_p2m4_zbv_comms.csv" --simulate
check torch_early_recv 0 "makespan 12," -- \
  "$bin" schedule --import "$data/torch/early_recv.csv" --simulate
check torch_as_trident 0 "makespan 16," -- \
  "$bin" schedule --import "$data/torch/early_recv.csv" --format trident --simulate
check torch_export 0 "wrote $tmp/dpv.csv" -- \
  "$bin" schedule dualpipev --pp 4 --microbatches 9 --export "$tmp/dpv.csv" --format torch
if grep -q -e '#' -e SEND "$tmp/dpv.csv"; then echo "FAIL torch export has a header or SEND"; fail=1; fi
"$bin" schedule dualpipev --pp 4 --microbatches 9 --simulate | grep makespan >"$tmp/dpv_gen"
check torch_round_trip 0 "$(cat "$tmp/dpv_gen")" -- "$bin" schedule --import "$tmp/dpv.csv" --simulate
printf '0F0,0WAIT0\n' >"$tmp/bad_torch.csv"
check torch_bad_cell 2 "cell '0WAIT0': unknown action" -- "$bin" schedule --import "$tmp/bad_torch.csv"
check bad_format 2 "--format csv" -- "$bin" schedule 1f1b --pp 2 --microbatches 2 --format csv
exit $fail
