#!/usr/bin/env bash
# Expert parallelism over MPI processes: examples/launch_ep.sh N gives the
# tokens of the single-rank engine on the host, with and without
# reconfigurations, on host ranks or (DEVICE cuda) on one GPU per rank with
# NCCL for data; and a failed rank ends the whole job with its error.
#   ep_mpi_test.sh PATH/TO/mlag N [DEVICE]
set -u
MLAG="$1"; N="$2"; DEVICE="${3:-host}"
here="$(cd "$(dirname "$0")/.." && pwd)"
if ! command -v mpirun >/dev/null 2>&1; then echo "mpirun not found: skipped"; exit 77; fi
if [ "$DEVICE" != host ] && ! "$MLAG" info --model tiny-v3 --device "$DEVICE" >/dev/null 2>&1; then
  echo "no $DEVICE device: skipped"; exit 77
fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
args=(--model tiny-v2 --num-requests 10 --prompt-len 13 --shared-prefix-len 4 --max-tokens 8 --seed 11 --json)
tokens() { grep -o '"output_tokens":\[[0-9,]*\]' "$1"; }
pass=0; fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
"$MLAG" run "${args[@]}" --device host >"$TMP/single.json" || { echo "single-rank run failed"; exit 1; }
launch() { MLAG="$MLAG" bash "$here/examples/launch_ep.sh" "$N" --device "$DEVICE" "$@"; }

if launch "${args[@]}" >"$TMP/mpi.json" 2>"$TMP/err"; then
  if [ -n "$(tokens "$TMP/single.json")" ] && [ "$(tokens "$TMP/single.json")" = "$(tokens "$TMP/mpi.json")" ]; then
    ok; else bad "ep $N over MPI ($DEVICE): tokens differ"; fi
else
  bad "launch_ep.sh $N ($DEVICE): $(tail -3 "$TMP/err")"
fi
if [ "$N" -ge 2 ]; then
  half=$(( N / 2 ))
  if launch "${args[@]}" --reconfigure-at 3:$half --reconfigure-at 6:$N >"$TMP/re.json" 2>"$TMP/err"; then
    if [ "$(tokens "$TMP/single.json")" = "$(tokens "$TMP/re.json")" ] && grep -q '"kv_pages_unchanged":true' "$TMP/re.json" && ! grep -q '"kv_pages_unchanged":false' "$TMP/re.json"; then
      ok; else bad "ep $N over MPI ($DEVICE) with reconfiguration"; fi
  else
    bad "launch_ep.sh $N ($DEVICE) with reconfiguration: $(tail -3 "$TMP/err")"
  fi
  # Rank 1 fails at step 3 while rank 0 hangs there for 60 s: MPI cannot
  # wake a blocked peer, so the job ends (MPI_Abort) with rank 1's error,
  # long before the hang is over.
  start=$SECONDS
  launch "${args[@]}" --ep-timeout 3 --ep-fault fail:1:3 --ep-fault hang:0:3:60 >"$TMP/out" 2>"$TMP/err"
  rc=$?
  took=$((SECONDS - start))
  if [ "$rc" -ne 0 ] && grep -q "injected failure at step 3" "$TMP/err" && [ "$took" -lt 40 ]; then
    ok; else bad "failed rank ($DEVICE): exit $rc after $took s: $(tail -3 "$TMP/err")"; fi
  # A hang alone: the other ranks give up after the 3 s timeout, naming it.
  start=$SECONDS
  launch "${args[@]}" --ep-timeout 3 --ep-fault hang:1:3:60 >"$TMP/out" 2>"$TMP/err"
  rc=$?
  took=$((SECONDS - start))
  if [ "$rc" -ne 0 ] && grep -q "a peer is dead or hung" "$TMP/err" && [ "$took" -lt 40 ]; then
    ok; else bad "hung rank ($DEVICE): exit $rc after $took s: $(tail -3 "$TMP/err")"; fi
fi
echo "ep_mpi_np$N ($DEVICE): $pass passed, $fail failed"
[ "$fail" -eq 0 ]
