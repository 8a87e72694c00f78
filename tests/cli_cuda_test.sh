#!/usr/bin/env bash
# The command line on a CUDA device (a real GPU, or the CPU emulation of
# builds with -Demulate_cuda=true): `mlag run --device cuda
# --kv-cache-dtype f32` gives the tokens of `--device host` on both tiny
# models (CUDA with the overlapped loop, its default, and without),
# `mlag info` shows bf16 as CUDA's KV cache default, `mlag graphs
# --device cuda` lists, from the captured CUDA graph, each layer's kv_update
# node right before its attention node, and `mlag bench --profile` reports
# every graph node with figures that agree with each other and with the
# step's. Exit 77 (skip) without a CUDA device.
#   cli_cuda_test.sh PATH/TO/mlag [all|runs|tools]
# PART (default all): "runs" is the memory plan and the token comparisons,
# "tools" the fp8 checkpoint, graphs, expert parallelism and bench; the
# emulated suite runs the two side by side.
set -u
MLAG="$1"
PART="${2:-all}"
want() { [ "$PART" = all ] || [ "$PART" = "$1" ]; }
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

emulated=0
grep -q "emulated" "$TMP/info" && emulated=1
if grep -q "^kv cache: bf16 by default on this device" "$TMP/info" &&
   "$MLAG" info --model tiny-v3 --device host | grep -q "^kv cache: f32 by default on this device"; then
  ok
else
  bad "mlag info does not show bf16 as CUDA's KV cache default: $(grep 'kv cache' "$TMP/info")"
fi

if want runs; then
# The memory plan is made against cudaMemGetInfo: on a 1 GB device (emulated;
# a real GPU ignores MLAG_EMULATED_GPU_MEMORY and has more) tiny-v3's plan
# fits within it and runs, and small's bf16 weights are refused before any
# allocation, naming the source.
if [ "$emulated" = 1 ]; then
  if MLAG_EMULATED_GPUS=1 MLAG_EMULATED_GPU_MEMORY=1G "$MLAG" run --model tiny-v3 --device cuda \
    --num-requests 2 --max-tokens 3 --json >"$TMP/plan.json" 2>"$TMP/err" &&
    python3 - "$TMP/plan.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["stats"]["memory_plan"]
assert m["source"] == "cudaMemGetInfo" and m["available_bytes"] <= 1 << 30, m
assert m["planned_bytes"] <= m["usable_bytes"] <= 0.9 * m["available_bytes"] + 1, m
assert 0 < m["allocated_bytes"] <= m["planned_bytes"], m
PY
  then
    ok
  else
    bad "tiny-v3 planned on a 1 GB device: $(tail -3 "$TMP/err")"
  fi
  MLAG_EMULATED_GPUS=1 MLAG_EMULATED_GPU_MEMORY=1G "$MLAG" run --model small --device cuda \
    --num-requests 1 --max-tokens 2 >/dev/null 2>"$TMP/err"
  rc=$?
  if [ $rc -eq 2 ] && grep -q "weights .* exceed .* usable (0.9 of .* available: cudaMemGetInfo)" "$TMP/err"; then
    ok
  else
    bad "small on a 1 GB device: exit $rc, $(cat "$TMP/err")"
  fi
fi

# f32 cache on both (CUDA's default is bf16, which rounds each cached latent).
for model in tiny-v3 tiny-v2; do
  args=(run --model "$model" --num-requests 16 --prompt-len 21 --max-tokens 10 --kv-cache-dtype f32 --json)
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
  if grep -q '"overlapped_steps":[1-9]' "$TMP/cuda.json"; then
    ok
  else
    bad "$model: the CUDA run did not overlap its steps"
  fi
  [ "$model" = tiny-v3 ] || continue  # the loop without overlap: once is enough
  if MLAG_EMULATED_GPUS=1 "$MLAG" "${args[@]}" --device cuda --step-overlap off >"$TMP/cuda_off.json" 2>"$TMP/err" &&
     grep -q '"overlapped_steps":0' "$TMP/cuda_off.json" &&
     [ "$(tokens "$TMP/cuda_off.json")" = "$(tokens "$TMP/host.json")" ]; then
    ok
  else
    bad "$model: cuda without the overlap differs from host: $(tail -3 "$TMP/err")"
  fi
done

fi

if want tools; then
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
# (Only the emulation can pose as an sm_80 device.)
if [ $emulated -eq 0 ]; then
  echo "fp8 on sm_80: a real GPU, not run"
elif MLAG_EMULATED_GPUS=1 MLAG_EMULATED_COMPUTE_CAPABILITY=80 "$MLAG" info --model "$TMP/fp8" --device cuda \
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
ep_args=(--model tiny-v2 --num-requests 40 --prompt-len 29 --shared-prefix-len 16 --max-tokens 24 --seed 11 --kv-cache-dtype f32 --json)
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

# The per-node profile: each node's figures from its bytes, FLOPs and time
# against the run's ceilings; the nodes' FLOPs add up to the step's (counted
# independently from the model's dimensions); their bytes to at least the
# step's (which leaves out activations); their times fit in the profiled
# step's wall time; the replays' idle gaps are measured.
if MLAG_EMULATED_GPUS=1 "$MLAG" bench --model tiny-v3 --device cuda --batch-sizes 1,4 --steps 2 \
     --prefill-lens 16 --bandwidth-gib 0.25 --profile --json >"$TMP/bench.json" 2>"$TMP/err" &&
   python3 - "$TMP/bench.json" $emulated <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
close = lambda a, b, tol=1e-9: abs(a - b) <= tol * max(abs(a), abs(b))
m = j["machine"]
assert m["emulated_times"] == (sys.argv[2] == "1"), m
assert j["weight_dtype"] == "bf16" and j["weight_dtype_defaulted"] and j["kv_cache_dtype"] == "bf16", j
peaks = m["matmul_peak_tflops"]
# bf16 and f32 always; e4m3 (cuBLASLt's block scaling) on sm_90, which the
# emulation's default is.
assert {"bf16", "f32"} <= set(peaks) <= {"bf16", "f32", "fp8"} and all(p > 0 for p in peaks.values()), peaks
bw = m["bandwidth_gb_s"] * 1e9
for d in j["decode"]:
    nodes = {n["node"]: n for n in d["nodes"]}
    assert {"layers.*.attn.mla", "layers.*.attn.kv_update", "layers.*.moe.experts", "lm_head"} <= set(nodes), sorted(nodes)
    assert not any(c.isdigit() for n in nodes for c in n), sorted(nodes)
    us = [n["us"] for n in d["nodes"]]
    assert us == sorted(us, reverse=True) and all(u > 0 for u in us), us
    assert sum(us) <= 1e3 * d["profiled_step_wall_ms"], (sum(us), d["profiled_step_wall_ms"])
    for n in d["nodes"]:
        assert n["launches"] >= 1 and n["bytes"] >= 0 and n["gflop"] >= 0, n
        assert close(n["gb_s"], n["bytes"] / (n["us"] / 1e6) / 1e9), n
        assert close(n["fraction_of_bandwidth"], n["bytes"] / (n["us"] / 1e6) / bw), n
        if n["gflop"] > 0:
            assert close(n["fraction_of_matmul_peak"], n["gflop"] * 1e9 / (n["us"] / 1e6) / (peaks[n["dtype"]] * 1e12)), n
    assert nodes["lm_head"]["dtype"] == "bf16" and nodes["layers.*.attn.mla"]["dtype"] == "bf16", nodes
    assert close(sum(n["gflop"] for n in d["nodes"]), d["gflop_per_step"], 1e-6), (sum(n["gflop"] for n in d["nodes"]), d["gflop_per_step"])
    assert sum(n["bytes"] for n in d["nodes"]) >= d["bytes_per_step"], (sum(n["bytes"] for n in d["nodes"]), d["bytes_per_step"])
    assert d["launch_gap_us"] >= 0 and d["replay_device_ms"] > 0, d
PY
then
  ok
else
  bad "bench --profile on cuda: $(tail -5 "$TMP/err")"
fi

fi

echo "cli_cuda ($PART): $pass passed, $fail failed"
[ "$fail" -eq 0 ]
