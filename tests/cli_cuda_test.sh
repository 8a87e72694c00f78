#!/usr/bin/env bash
# The command line on a CUDA device (a real GPU, or the CPU emulation of
# builds with -Demulate_cuda=true): `mlag run --device cuda` gives the
# tokens of `--device host` on both tiny models, and `mlag graphs --device
# cuda` lists, from the captured CUDA graph, each layer's kv_update node
# right before its attention node. Exit 77 (skip) without a CUDA device.
#   cli_cuda_test.sh PATH/TO/mlag
set -u
MLAG="$1"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if ! MLAG_EMULATED_GPUS=1 "$MLAG" info --model tiny-v3 --device cuda >"$TMP/info" 2>&1; then
  echo "no CUDA device: skipped ($(tail -1 "$TMP/info"))"
  exit 77
fi
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tokens() { grep -o '"output_tokens":\[[0-9,]*\]' "$1"; }

for model in tiny-v3 tiny-v2; do
  args=(run --model "$model" --num-requests 16 --prompt-len 21 --max-tokens 10 --json)
  if ! MLAG_EMULATED_GPUS=1 "$MLAG" "${args[@]}" --device cuda >"$TMP/cuda.json" 2>"$TMP/err"; then
    bad "$model on cuda: $(tail -3 "$TMP/err")"
    continue
  fi
  "$MLAG" "${args[@]}" --device host >"$TMP/host.json"
  if [ "$(tokens "$TMP/cuda.json" | wc -l)" -eq 16 ] && [ "$(tokens "$TMP/cuda.json")" = "$(tokens "$TMP/host.json")" ]; then
    ok
  else
    bad "$model: cuda and host tokens differ"
  fi
done

# An fp8 checkpoint on CUDA. On sm_89 and later (the emulated devices are
# 9.0) the projections stay fp8 and run through the FP8 block-scaled GEMM,
# the routed experts through the grouped GEMM (widened as loaded); lm_head is
# bf16. On an older GPU (emulated 8.0) everything is held in bf16,
# dequantized at load: the fallback (whose bf16 matmuls the op cases cover).
# The run is a graph replay.
"$MLAG" export --model tiny-v3 --weight-dtype fp8 --out "$TMP/fp8" >/dev/null
if MLAG_EMULATED_GPUS=1 "$MLAG" info --model "$TMP/fp8" --device cuda >"$TMP/fp8info" 2>"$TMP/err" &&
   grep -q "bf16 [0-9.]* MiB" "$TMP/fp8info" && grep -q "fp8 [0-9.]* MiB" "$TMP/fp8info"; then
  ok
else
  bad "fp8 checkpoint on cuda sm_90 does not hold fp8 projections: $(cat "$TMP/fp8info" "$TMP/err" | tail -3)"
fi
if MLAG_EMULATED_GPUS=1 MLAG_EMULATED_COMPUTE_CAPABILITY=80 "$MLAG" info --model "$TMP/fp8" --device cuda \
     >"$TMP/fp8info80" 2>"$TMP/err" &&
   grep -q "bf16 [0-9.]* MiB" "$TMP/fp8info80" && ! grep -q "fp8 [0-9.]* MiB" "$TMP/fp8info80"; then
  ok
else
  bad "fp8 checkpoint on cuda sm_80 is not held in bf16: $(cat "$TMP/fp8info80" "$TMP/err" | tail -3)"
fi
if MLAG_EMULATED_GPUS=1 "$MLAG" run --model "$TMP/fp8" --device cuda --num-requests 4 --prompt-len 13 \
     --max-tokens 3 --json >"$TMP/fp8.json" 2>"$TMP/err" && [ "$(tokens "$TMP/fp8.json" | wc -l)" -eq 4 ]; then
  ok
else
  bad "fp8 checkpoint on cuda sm_90: $(tail -3 "$TMP/err")"
fi

# Every layer's kv_update node, then its attention node, read from the CUDA graph.
if MLAG_EMULATED_GPUS=1 "$MLAG" graphs --device cuda --model tiny-v3 --size 8 --max-num-seqs 8 >"$TMP/graphs" 2>"$TMP/err"; then
  layers=$(grep -c "attn.kv_update kernel" "$TMP/graphs")
  ordered=0
  for i in $(seq 0 $((layers - 1))); do
    if grep -A1 "^  layers.$i.attn.kv_update kernel" "$TMP/graphs" | grep -q "^  layers.$i.attn.mla kernel"; then
      ordered=$((ordered + 1))
    fi
  done
  if [ "$layers" -eq 4 ] && [ "$ordered" -eq 4 ] && grep -q "CUDA graph node" "$TMP/graphs"; then ok; else bad "graphs: $layers layers, $ordered in order"; fi
else
  bad "graphs on cuda: $(tail -3 "$TMP/err")"
fi

# Expert parallelism over NCCL, four thread ranks on four GPUs, through two
# reconfigurations: the tokens of one host engine, every live KV page kept.
ep_args=(--model tiny-v2 --num-requests 40 --prompt-len 29 --shared-prefix-len 16 --max-tokens 24 --seed 11 --json)
if MLAG_EMULATED_GPUS=4 "$MLAG" run "${ep_args[@]}" --device cuda --ep 4 --ep-backend nccl \
     --reconfigure-at 8:2 --reconfigure-at 16:3 >"$TMP/ep.json" 2>"$TMP/err"; then
  "$MLAG" run "${ep_args[@]}" --device host >"$TMP/host40.json"
  if [ "$(tokens "$TMP/ep.json" | wc -l)" -eq 40 ] && [ "$(tokens "$TMP/ep.json")" = "$(tokens "$TMP/host40.json")" ] &&
     [ "$(grep -o '"kv_pages_unchanged":true' "$TMP/ep.json" | wc -l)" -eq 2 ]; then
    ok
  else
    bad "nccl ep 4: tokens or kv pages differ"
  fi
elif grep -q "needs 4 CUDA devices" "$TMP/err"; then
  echo "nccl ep 4: fewer than 4 CUDA devices, not run"
else
  bad "nccl ep 4: $(tail -3 "$TMP/err")"
fi

echo "cli_cuda: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
