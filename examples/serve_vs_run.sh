#!/usr/bin/env bash
# Throughput of mlag serve against mlag run on the same requests: N prompts
# of random token ids (seeded), greedy, T tokens each, no stop at eos. run
# steps them in one process; serve gets them from N concurrent curl clients
# on 127.0.0.1. Prints both tokens/s (serve's wall time counts from the
# first request sent to the last response received).
#
#   bash examples/serve_vs_run.sh [MODEL] [N] [PROMPT_LEN] [T]   (defaults: tiny-v3 64 32 32)
set -euo pipefail
MLAG=${MLAG:-build/examples/mlag}
MODEL=${1:-tiny-v3}
N=${2:-64}
LEN=${3:-32}
T=${4:-32}
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$TMP"' EXIT
python3 - "$TMP/prompts.txt" "$N" "$LEN" <<'PY'
import random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    for _ in range(int(sys.argv[2])):
        f.write(" ".join(str(random.randrange(5, 1000)) for _ in range(int(sys.argv[3]))) + "\n")
PY
"$MLAG" run --model "$MODEL" --prompts "$TMP/prompts.txt" --max-tokens "$T" --max-num-seqs "$N" --json \
  >"$TMP/run.json"
run_tps=$(python3 -c "import json; s=json.load(open('$TMP/run.json'))['stats']; print(s['tokens_out']/s['run_seconds'])")

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$MLAG" serve --model "$MODEL" --port "$port" --max-num-seqs "$N" >"$TMP/serve.log" 2>&1 &
for _ in $(seq 1 300); do curl -s -o /dev/null "http://127.0.0.1:$port/health" && break; sleep 0.1; done
i=0
while read -r line; do
  ids=$(echo "$line" | tr ' ' ',')
  echo '{"prompt":['"$ids"'],"max_tokens":'"$T"',"temperature":0,"ignore_eos":true}' >"$TMP/req-$i.json"
  i=$((i + 1))
done <"$TMP/prompts.txt"
clients=()
start=$(date +%s.%N)
for j in $(seq 0 $((N - 1))); do
  curl -s --max-time 600 "http://127.0.0.1:$port/v1/completions" -d @"$TMP/req-$j.json" >"$TMP/out-$j.json" &
  clients+=($!)
done
wait "${clients[@]}"
end=$(date +%s.%N)
serve_tokens=$(python3 -c "
import json
print(sum(json.load(open('$TMP/out-%d.json' % j))['usage']['completion_tokens'] for j in range($N)))")
python3 -c "
run, tokens, secs = $run_tps, $serve_tokens, $end - $start
print(f'mlag run:   {run:9.1f} tokens/s ($N requests x $T tokens)')
print(f'mlag serve: {tokens / secs:9.1f} tokens/s ({tokens} tokens in {secs:.2f} s from $N concurrent clients), {tokens / secs / run:.2f}x run')"
