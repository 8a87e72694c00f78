#!/usr/bin/env bash
# Expert parallelism over MPI processes: examples/launch_ep.sh N gives the
# tokens of the single-rank engine, with and without reconfigurations.
#   ep_mpi_test.sh PATH/TO/mlag N
set -u
MLAG="$1"; N="$2"
here="$(cd "$(dirname "$0")/.." && pwd)"
if ! command -v mpirun >/dev/null 2>&1; then echo "mpirun not found: skipped"; exit 77; fi
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
args=(--model tiny-v2 --num-requests 10 --prompt-len 13 --shared-prefix-len 4 --max-tokens 8 --seed 11 --json)
tokens() { grep -o '"output_tokens":\[[0-9,]*\]' "$1"; }
pass=0; fail=0
"$MLAG" run "${args[@]}" >"$TMP/single.json" || { echo "single-rank run failed"; exit 1; }
if MLAG="$MLAG" bash "$here/examples/launch_ep.sh" "$N" "${args[@]}" >"$TMP/mpi.json" 2>"$TMP/err"; then
  if [ -n "$(tokens "$TMP/single.json")" ] && [ "$(tokens "$TMP/single.json")" = "$(tokens "$TMP/mpi.json")" ]; then
    pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: ep $N over MPI: tokens differ"; fi
else
  fail=$((fail + 1)); echo "FAIL: launch_ep.sh $N: $(tail -3 "$TMP/err")"
fi
if [ "$N" -ge 2 ]; then
  half=$(( N / 2 ))
  if MLAG="$MLAG" bash "$here/examples/launch_ep.sh" "$N" "${args[@]}" --reconfigure-at 3:$half --reconfigure-at 6:$N >"$TMP/re.json" 2>"$TMP/err"; then
    if [ "$(tokens "$TMP/single.json")" = "$(tokens "$TMP/re.json")" ] && grep -q '"kv_pages_unchanged":true' "$TMP/re.json" && ! grep -q '"kv_pages_unchanged":false' "$TMP/re.json"; then
      pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: ep $N over MPI with reconfiguration"; fi
  else
    fail=$((fail + 1)); echo "FAIL: launch_ep.sh $N with reconfiguration: $(tail -3 "$TMP/err")"
  fi
fi
echo "ep_mpi_np$N: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
