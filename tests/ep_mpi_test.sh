#!/usr/bin/env bash
# Expert parallelism over MPI processes: examples/launch_ep.sh N gives the
# tokens of the single-rank engine on the host, with and without
# reconfigurations, on host ranks or (DEVICE cuda) on one GPU per rank with
# NCCL for data; and a failed rank ends the whole job with its error.
#   ep_mpi_test.sh PATH/TO/mlag N [DEVICE]
set -u
export LC_ALL=C  # a decimal point in the stamped times
MLAG="$1"; N="$2"; DEVICE="${3:-host}"
if [ -z "${EPOCHREALTIME:-}" ]; then echo "needs bash 5 (EPOCHREALTIME): skipped"; exit 77; fi
here="$(cd "$(dirname "$0")/.." && pwd)"
if ! command -v mpirun >/dev/null 2>&1; then echo "mpirun not found: skipped"; exit 77; fi
if [ "$DEVICE" != host ] && ! "$MLAG" info --model tiny-v3 --device "$DEVICE" >/dev/null 2>&1; then
  echo "no $DEVICE device: skipped"; exit 77
fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
# --max-num-seqs 4: each rank holds at most 3 of the 10 requests, and
# capturing only sizes up to 4 keeps the emulated CUDA start-up short.
# --kv-cache-dtype f32: the host's cache dtype (CUDA's default is bf16), so
# CUDA ranks give the host's tokens.
args=(--model tiny-v2 --num-requests 10 --prompt-len 13 --shared-prefix-len 4 --max-tokens 8 --seed 11 --max-num-seqs 4 --kv-cache-dtype f32 --json)
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
  # The fault tests. What they assert holds under any load: the job ends
  # with the fault classified (a failed rank's own error; the one peer-fault
  # form for a hang, whichever timer saw it), timed from the fault itself
  # (stderr lines are stamped as they arrive). The peer timeout is far above
  # any healthy wait: a healthy step's wait peaks near 1.5 s for four
  # emulated CUDA ranks sharing two busy cores, milliseconds on the host.
  if [ "$DEVICE" = host ]; then timeout=3; else timeout=10; fi
  # After the fault the job ends within the timeout, the grace for a peer's
  # report (kPeerReportGrace, 1 s), the step in flight and mpirun's
  # teardown; `slack` bounds the last two.
  slack=10
  # Fault time: the epoch seconds of the first stderr line matching $1.
  stamp_of() { grep -m1 -E "$1" "$TMP/err" | cut -d' ' -f1; }
  # Runs launch with stderr stamped; sets rc and end (epoch seconds).
  stamped() {
    launch "$@" 2>&1 >"$TMP/out" | while IFS= read -r line; do
      printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$TMP/err"
    rc=${PIPESTATUS[0]}; end=$EPOCHREALTIME
  }
  # within LO T0 T1 HI: true when LO <= T1 - T0 <= HI (seconds).
  within() { awk -v lo="$1" -v t0="$2" -v t1="$3" -v hi="$4" 'BEGIN{d=t1-t0; exit !(d>=lo && d<=hi)}'; }
  elapsed() { awk -v t0="$1" -v t1="$2" 'BEGIN{printf "%.1f", t1-t0}'; }

  # Rank 1 fails at step 3 while rank 0 hangs there for 60 s: MPI cannot
  # wake a blocked peer, so the job ends (MPI_Abort) with rank 1's error,
  # long before the hang is over.
  stamped "${args[@]}" --ep-timeout $timeout --ep-fault fail:1:3 --ep-fault hang:0:3:60
  t_fault=$(stamp_of "aborting the job: rank 1: injected failure at step 3")
  if [ "$rc" -ne 0 ] && [ -n "$t_fault" ] && within 0 "$t_fault" "$end" "$slack"; then
    ok; echo "failed rank ($DEVICE): the job ended $(elapsed "$t_fault" "$end") s after the failure"; else bad "failed rank ($DEVICE): exit $rc, $(elapsed "${t_fault:-$end}" "$end") s after the failure: $(tail -3 "$TMP/err")"; fi
  # A hang alone: the other ranks give up after the timeout, reporting the
  # classified peer fault with the waiting rank and the step.
  stamped "${args[@]}" --ep-timeout $timeout --ep-fault hang:1:3:60
  t_fault=$(stamp_of "rank 1: injected hang of 1m at step 3")
  classified="aborting the job: peer dead or hung: rank [0-9]+ of $N waited [0-9.hms]+ in .*, at step 3$"
  if [ "$rc" -ne 0 ] && [ -n "$t_fault" ] && grep -qE "$classified" "$TMP/err" &&
     within 0 "$t_fault" "$end" "$((timeout + 1 + slack))"; then
    ok; echo "hung rank ($DEVICE): the job ended $(elapsed "$t_fault" "$end") s after the hang began (timeout $timeout s): $(grep -m1 -oE "peer dead or hung: .*" "$TMP/err")"; else bad "hung rank ($DEVICE): exit $rc, $(elapsed "${t_fault:-$end}" "$end") s after the hang began: $(tail -3 "$TMP/err")"; fi
fi
echo "ep_mpi_np$N ($DEVICE): $pass passed, $fail failed"
[ "$fail" -eq 0 ]
