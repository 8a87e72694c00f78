#!/usr/bin/env bash
# mlag serve over HTTP on 127.0.0.1, through curl: models, streaming chat
# ending in [DONE], stream vs whole response, stop strings, bad requests
# (400 with an OpenAI-style error body), 32 concurrent greedy clients getting
# what each gets alone, a disconnecting client aborting its request, --ep 2
# giving the single engine's outputs, 429 past --max-pending, and /metrics.
# Every request is bounded in time.
#
# Usage: serve_test.sh MLAG
set -uo pipefail
MLAG=$1
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }
curl() { command curl -s --max-time 60 "$@"; }

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# start_server PORT ARGS...: starts mlag serve, waits for /health.
start_server() {
  local port=$1; shift
  "$MLAG" serve --model "$TMP/D" --port "$port" "$@" >"$TMP/serve-$port.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 300); do
    if curl -o /dev/null "http://127.0.0.1:$port/health"; then return 0; fi
    sleep 0.1
  done
  echo "server on $port did not come up:"; cat "$TMP/serve-$port.log"; return 1
}

"$MLAG" export --model tiny-v3 --out "$TMP/D" >/dev/null || { echo "FAIL: export"; exit 1; }
PORT=$(free_port)
start_server "$PORT" --max-pending 64 || exit 1
URL="http://127.0.0.1:$PORT"
M="$TMP/D"

# Models.
if curl "$URL/v1/models" | python3 -c "import json,sys; d=json.load(sys.stdin)['data']; assert d[0]['id']=='$M', d"; then
  ok "/v1/models"; else bad "/v1/models"; fi

# Streaming chat: chunks of JSON, ending in [DONE]; the same text as a whole response.
chat='{"model":"'"$M"'","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"temperature":0'
curl -N "$URL/v1/chat/completions" -d "$chat"',"stream":true,"stream_options":{"include_usage":true}}' >"$TMP/stream.txt"
curl "$URL/v1/chat/completions" -d "$chat}" >"$TMP/whole.json"
if python3 - "$TMP/stream.txt" "$TMP/whole.json" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]).read().split("\n") if l.startswith("data: ")]
assert lines[-1] == "data: [DONE]", lines[-1:]
chunks = [json.loads(l[6:]) for l in lines[:-1]]
assert chunks[0]["choices"][0]["delta"]["role"] == "assistant", chunks[0]
text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
usage = chunks[-1]["usage"]
whole = json.load(open(sys.argv[2]))
assert whole["object"] == "chat.completion", whole
assert text == whole["choices"][0]["message"]["content"], (text, whole)
assert finish == whole["choices"][0]["finish_reason"] == "length", (finish, whole)
assert usage == whole["usage"] and usage["completion_tokens"] == 8, (usage, whole["usage"])
PY
then ok "streaming chat ends in [DONE] and matches the whole response"; else bad "streaming chat"; fi

# Stop strings: the text stops just before the first stop string.
comp='{"prompt":"Hello, world","max_tokens":24,"temperature":0'
curl "$URL/v1/completions" -d "$comp}" >"$TMP/full.json"
stop=$(python3 -c "import json,sys; t=json.load(open('$TMP/full.json'))['choices'][0]['text']; print(json.dumps(t[4:6]))")
curl "$URL/v1/completions" -d "$comp"',"stop":['"$stop"']}' >"$TMP/stopped.json"
if python3 - "$TMP/full.json" "$TMP/stopped.json" "$stop" <<'PY'
import json, sys
full = json.load(open(sys.argv[1]))["choices"][0]["text"]
got = json.load(open(sys.argv[2]))["choices"][0]
stop = json.loads(sys.argv[3])
assert got["finish_reason"] == "stop", got
assert got["text"] == full[:full.index(stop)], (got["text"], full, stop)
PY
then ok "stop string"; else bad "stop string: $(cat "$TMP/stopped.json")"; fi

# Bad requests: 400 (404 for another model) with an error body naming the problem.
expect_error() {  # STATUS SUBSTRING PATH BODY
  local code
  code=$(curl -o "$TMP/err.json" -w '%{http_code}' "$URL$3" -d "$4")
  if [ "$code" = "$1" ] && python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert sys.argv[2] in e["message"], e' "$TMP/err.json" "$2" 2>/dev/null; then
    ok "$1 for $4"
  else
    bad "expected $1 naming '$2' for $4, got $code: $(cat "$TMP/err.json")"
  fi
}
expect_error 400 "not valid JSON" /v1/completions 'nope'
expect_error 400 "'prompt' is required" /v1/completions '{"max_tokens":4}'
expect_error 400 "'max_tokens'" /v1/completions '{"prompt":"x","max_tokens":0}'
expect_error 400 "'temperature'" /v1/completions '{"prompt":"x","temperature":-1}'
expect_error 400 "'n'" /v1/completions '{"prompt":"x","n":2}'
expect_error 400 "outside the vocabulary" /v1/completions '{"prompt":[1,2,99999]}'
long=$(python3 -c "print(','.join(['7'] * 300))")
expect_error 400 "max_model_len" /v1/completions '{"prompt":['"$long"']}'
expect_error 400 "exceeds max_model_len" /v1/completions '{"prompt":[1,2,3],"max_tokens":1000}'
expect_error 400 "role 'robot'" /v1/chat/completions '{"messages":[{"role":"robot","content":"x"}]}'
expect_error 400 "'messages'" /v1/chat/completions '{"messages":[]}'
expect_error 404 "is not served here" /v1/completions '{"model":"other","prompt":"x"}'

# 32 concurrent greedy clients get exactly what each gets alone (tokens and
# logprobs, to the bit: the host is batch-invariant).
req() { echo '{"prompt":['"$(( $1 % 900 + 5 )),$(( $1 * 7 % 1000 )),$(( $1 * 13 % 1000 )),42"'],"max_tokens":12,"temperature":0,"logprobs":1}'; }
for i in $(seq 0 31); do curl "$URL/v1/completions" -d "$(req "$i")" >"$TMP/alone-$i.json"; done
cpids=()
for i in $(seq 0 31); do curl "$URL/v1/completions" -d "$(req "$i")" >"$TMP/together-$i.json" & cpids+=($!); done
wait "${cpids[@]}"
same=0
for i in $(seq 0 31); do
  if python3 - "$TMP/alone-$i.json" "$TMP/together-$i.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["choices"][0] for p in sys.argv[1:3])
assert a["logprobs"]["tokens"] and a["text"] == b["text"], (a["text"], b["text"])
assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
assert a["logprobs"]["token_logprobs"] == b["logprobs"]["token_logprobs"]
PY
  then same=$((same + 1)); fi
done
if [ "$same" = 32 ]; then ok "32 concurrent clients: every output as alone"; else bad "only $same of 32 concurrent outputs match"; fi
steps_after=$(curl "$URL/metrics" | awk '/^mlag_step_seconds_count/ {print $2}')
[ -n "$steps_after" ] && ok "metrics count steps ($steps_after)" || bad "no step count in /metrics"

# A client that disconnects mid-stream aborts its request.
aborted() { curl "$URL/metrics" | awk '/^mlag_requests_total\{outcome="aborted"\}/ {print $2}'; }
before=$(aborted)
command curl -sN --max-time 20 "$URL/v1/completions" \
  -d '{"prompt":"Hello","max_tokens":240,"temperature":0,"stream":true,"ignore_eos":true}' | head -c 10 >/dev/null
after=$before
for _ in $(seq 1 100); do
  after=$(aborted)
  [ "$after" != "$before" ] && break
  sleep 0.05
done
if [ "$after" -gt "$before" ]; then ok "a disconnect aborts its request"; else bad "no abort after a disconnect ($before -> $after)"; fi

# /metrics names what the issue asks for.
curl "$URL/metrics" >"$TMP/metrics.txt"
for m in mlag_requests_total mlag_generation_tokens_total mlag_step_seconds_sum mlag_kv_usage_ratio \
         mlag_prefix_cache_hit_rate mlag_graph_replays_total; do
  grep -q "^$m" "$TMP/metrics.txt" && ok "metric $m" || bad "metric $m missing"
done
# The memory plan's bytes: allocated <= planned <= usable, all positive.
mem() { awk -v k="$1" '$1 == "mlag_memory_bytes{kind=\"" k "\"}" {printf "%.0f", $2}' "$TMP/metrics.txt"; }
usable=$(mem usable) planned=$(mem planned) allocated=$(mem allocated)
if [ -n "$allocated" ] && [ "$allocated" -gt 0 ] && [ "$allocated" -le "$planned" ] &&
  [ "$planned" -le "$usable" ]; then
  ok "memory plan metrics ($allocated <= $planned <= $usable)"
else
  bad "memory plan metrics: usable '$usable' planned '$planned' allocated '$allocated'"
fi

# Expert parallelism: two host thread ranks give every request exactly the
# tokens and logprobs of the single engine (the host is batch-invariant at
# any expert-parallel size).
PORT3=$(free_port)
start_server "$PORT3" --ep 2 || exit 1
cpids=()
for i in $(seq 0 7); do
  curl "http://127.0.0.1:$PORT3/v1/completions" -d "$(req "$i")" >"$TMP/ep-$i.json" & cpids+=($!)
done
wait "${cpids[@]}"
same=0
for i in $(seq 0 7); do
  if python3 - "$TMP/alone-$i.json" "$TMP/ep-$i.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["choices"][0] for p in sys.argv[1:3])
assert a["text"] == b["text"] and a["logprobs"] == b["logprobs"], (a, b)
PY
  then same=$((same + 1)); fi
done
if [ "$same" = 8 ]; then ok "--ep 2: every output as on one engine"; else bad "--ep 2: only $same of 8 outputs match"; fi
if curl "http://127.0.0.1:$PORT3/v1/models" | grep -q '"object":"list"'; then ok "--ep 2 serves"; else bad "--ep 2 /v1/models"; fi

# Past --max-pending: 429 with an error body.
PORT2=$(free_port)
start_server "$PORT2" --max-pending 1 || exit 1
cpids=()
for i in 1 2 3 4; do
  curl -o "$TMP/busy-$i.json" -w '%{http_code}\n' "http://127.0.0.1:$PORT2/v1/completions" \
    -d '{"prompt":"Hello","max_tokens":240,"ignore_eos":true}' >"$TMP/busy-code-$i" & cpids+=($!)
done
wait "${cpids[@]}"
codes=$(cat "$TMP"/busy-code-* | sort | tr '\n' ' ')
if grep -q 429 "$TMP"/busy-code-* && grep -q 200 "$TMP"/busy-code-*; then ok "429 past --max-pending ($codes)"; else bad "expected 200 and 429, got $codes"; fi

[ "$fails" -eq 0 ] && echo "serve: all passed" || { echo "serve: $fails failed"; exit 1; }
