#!/usr/bin/env bash
# The mlag command line as a user meets it: one-line errors with exit code 2,
# JSON that parses, graph and eager runs that agree, export then load.
#   cli_test.sh PATH/TO/mlag
set -u
MLAG="$1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# expect_usage_error NEEDLE ARGS...: exit 2, exactly one stderr line containing NEEDLE.
expect_usage_error() {
  local needle="$1"; shift
  "$MLAG" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ne 2 ]; then bad "mlag $* exited $rc, expected 2"; return; fi
  if [ "$lines" -ne 1 ]; then bad "mlag $* printed $lines stderr lines: $(cat "$TMP/err")"; return; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then bad "mlag $*: '$(cat "$TMP/err")' lacks '$needle'"; return; fi
  ok
}

expect_usage_error "/nonexistent/model" run --model /nonexistent/model
expect_usage_error "max-tokens" run --model tiny-v3 --max-tokens -3
expect_usage_error "" run --max-tokens -3
expect_usage_error "graph mode" run --model tiny-v3 --graph-mode sometimes
expect_usage_error "/nonexistent/prompts" run --model tiny-v3 --prompts /nonexistent/prompts
printf '1 2 3\n4 five 6\n' >"$TMP/bad_prompts"
expect_usage_error ":2:" run --model tiny-v3 --prompts "$TMP/bad_prompts"
printf '1 2 999999\n' >"$TMP/oov_prompts"
expect_usage_error "vocabulary" run --model tiny-v3 --prompts "$TMP/oov_prompts"
expect_usage_error "max_model_len" run --model tiny-v3 --prompt-len 250 --max-tokens 10
expect_usage_error "kv-cache-bytes" run --model tiny-v3 --kv-cache-bytes -5
expect_usage_error "top-p" run --model tiny-v3 --top-p 1.5
expect_usage_error "" bogus
expect_usage_error "" run --model tiny-v3 --no-such-flag
expect_usage_error "device" run --model tiny-v3 --device tpu
expect_usage_error "no graph of size" graphs --model tiny-v3 --size 3
# Flags with no effect are refused, and a device is never ignored.
expect_usage_error "needs --ep" run --model tiny-v3 --reconfigure-at 2:1
expect_usage_error "needs --ep" run --model tiny-v3 --ep-backend mpi
expect_usage_error "ep-backend nccl" run --model tiny-v3 --ep 2 --device cuda
expect_usage_error "ep-backend" run --model tiny-v3 --ep 2 --ep-backend carrier-pigeon
expect_usage_error "batch-sizes" bench --model tiny-v3 --batch-sizes 0

# JSON output parses and has the documented fields.
common=(--model tiny-v3 --num-requests 6 --prompt-len 11 --shared-prefix-len 4 --max-tokens 5 --seed 3 --json)
if "$MLAG" run "${common[@]}" >"$TMP/graph.json" 2>"$TMP/err"; then ok; else bad "json run failed: $(cat "$TMP/err")"; fi
if command -v python3 >/dev/null 2>&1; then
  if python3 - "$TMP/graph.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert len(j["requests"]) == 6, j
for r in j["requests"]:
    assert r["prompt_tokens"] == 11 and len(r["output_tokens"]) == 5 and r["finish_reason"] == "length", r
s = j["stats"]
for k in ("steps", "graph_replays", "eager_steps", "prefix_cache_hit_rate", "capture_seconds"):
    assert k in s, k
assert sum(s["graph_replays"].values()) > 0, s
PY
  then ok; else bad "JSON content"; fi
fi

# Graph replay and eager give the same tokens.
"$MLAG" run "${common[@]}" --graph-mode none >"$TMP/eager.json" 2>/dev/null
tokens() { grep -o '"output_tokens":\[[0-9,]*\]' "$1"; }
if [ -n "$(tokens "$TMP/graph.json")" ] && [ "$(tokens "$TMP/graph.json")" = "$(tokens "$TMP/eager.json")" ]; then ok; else bad "graph vs eager tokens differ"; fi

# Logprobs appear in JSON when asked for.
if "$MLAG" run --model tiny-v3 --num-requests 1 --prompt-len 5 --max-tokens 2 --logprobs 3 --json | grep -q '"logprobs"'; then ok; else bad "logprobs missing"; fi

# Export, then load the directory: same tokens as the built-in model.
if "$MLAG" export --model tiny-v2 --out "$TMP/tiny-v2" >/dev/null; then ok; else bad "export"; fi
"$MLAG" run --model tiny-v2 --num-requests 3 --prompt-len 9 --max-tokens 4 --json >"$TMP/a.json"
"$MLAG" run --model "$TMP/tiny-v2" --num-requests 3 --prompt-len 9 --max-tokens 4 --json >"$TMP/b.json"
if [ -n "$(tokens "$TMP/a.json")" ] && [ "$(tokens "$TMP/a.json")" = "$(tokens "$TMP/b.json")" ]; then ok; else bad "exported model differs"; fi

# mlag bench prints JSON with positive byte counts and a measured ceiling.
if "$MLAG" bench --model tiny-v3 --batch-sizes 1,8 --steps 2 --prefill-len 16 --bandwidth-gib 0.25 --json >"$TMP/bench.json" 2>"$TMP/err"; then ok; else bad "bench failed: $(cat "$TMP/err")"; fi
if command -v python3 >/dev/null 2>&1; then
  if python3 - "$TMP/bench.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["machine"]["bandwidth_gb_s"] > 0, j["machine"]
assert [d["batch"] for d in j["decode"]] == [1, 8], j["decode"]
for d in j["decode"]:
    assert d["bytes_per_step"] > 0 and d["graph_ms"] > 0 and d["eager_ms"] > 0, d
    assert 0 < d["fraction_of_bandwidth"], d
assert j["prefill"]["tokens_per_s"] > 0
for k in ("build_seconds", "capture_seconds", "weight_dtype", "weight_bytes_by_dtype", "kv_cache_dtype"):
    assert k in j, k
PY
  then ok; else bad "bench JSON content"; fi
fi

# fp8: export in DeepSeek-V3's layout, run the directory, info names the fp8
# weights and their bytes; every command takes --weight-dtype.
if "$MLAG" export --model tiny-v3 --weight-dtype fp8 --out "$TMP/fp8" >/dev/null; then ok; else bad "fp8 export"; fi
if "$MLAG" run --model "$TMP/fp8" --num-requests 2 --prompt-len 7 --max-tokens 3 --json | grep -q '"output_tokens"'; then ok; else bad "fp8 run"; fi
if "$MLAG" info --model "$TMP/fp8" | grep -q "fp8 [0-9.]* MiB"; then ok; else bad "info does not report fp8 weights"; fi
if "$MLAG" info --model tiny-v3 --weight-dtype bf16 | grep -q "bf16 [0-9.]* MiB"; then ok; else bad "info --weight-dtype bf16"; fi
if "$MLAG" graphs --model tiny-v3 --size 2 --max-num-seqs 2 --weight-dtype fp8 >/dev/null; then ok; else bad "graphs --weight-dtype"; fi
expect_usage_error "weight-dtype" run --model tiny-v3 --weight-dtype int4

# mlag graphs lists kv_update immediately followed by mla.
"$MLAG" graphs --model tiny-v3 --size 8 --max-num-seqs 8 --dot "$TMP/g.dot" >"$TMP/graphs.txt"
if grep -q "^size 8: " "$TMP/graphs.txt" && grep -A1 "layers.2.attn.kv_update kernel" "$TMP/graphs.txt" | grep -q "layers.2.attn.mla kernel" && grep -q "digraph" "$TMP/g.dot"; then ok; else bad "graphs listing"; fi

echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
