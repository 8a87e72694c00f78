#!/usr/bin/env bash
# The GPU checks of one device session, on a bare machine with the CUDA
# toolkit and driver, python3 and the nvidia-nccl wheel, from a device bundle
# made beforehand where packages can be had (tests/gpu/make_device_bundle.sh):
#   1. the bundle's executables, if they load here; else a fallback build
#      from the bundle's source and packages (NCCL from the wheel);
#   2. the gpu suite: every CUDA op of the op harness against its reference,
#      graph replay vs eager, dummy replays vs live KV pages, the runtime and
#      the command line on the device (tokens equal to the host's);
#   3. the MLA decode kernels at b=128, context 4096, 16 heads, against the
#      copy bandwidth of the same run;
#   4. mlag bench --device cuda --profile on `small` and `v2-lite-8l`, batch
#      1, 32 and 256: whole steps and each graph node against the copy
#      bandwidth and the tensor-core peak measured in the same run;
#   5. v2-lite-8l with fp8 weights at batch 1 and 16, through cuBLASLt's
#      block-scaled FP8 and through the tensor-core GEMM it replaces;
#   6. v2-lite-8l bf16 at batch 1 and 32 with plain launches (MLAG_PDL=0),
#      beside step 4's programmatic dependent launches.
# Every step has its own time limit and all share one deadline (8 minutes
# from the start), so a hang costs one step and the run always reports.
# $OUT gets three files: summary.txt (a table of every step and the
# figures), figures.json (every figure) and logs.tgz (every step's log).
#
#   device tool: carry [".device-bundle"], command
#     "bash tests/gpu/run_device_checks.sh", timeout_s 540
#   elsewhere: copy .device-bundle/ to the GPU machine, then
#     OUT=DIR bash .device-bundle/scripts/run_device_checks.sh
# Environment: MLAG_DEVICE_BUNDLE (the bundle's folder), MLAG_DEVICE_DEADLINE_S
# (480), MLAG_DEVICE_FALLBACK=1 (build from source even if the executables
# load), OUT.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ -n "${MLAG_DEVICE_BUNDLE:-}" ]; then
  bundle="$MLAG_DEVICE_BUNDLE"
elif [ -f "$here/../bin.tgz" ]; then
  bundle="$here/.."
else
  bundle="$here/../../.device-bundle"
fi
bundle="$(cd "$bundle" 2>/dev/null && pwd)" || { echo "no device bundle at $bundle" >&2; exit 1; }
OUT="${OUT:-/tmp/mlag-device-checks}"
mkdir -p "$OUT"
work=$(mktemp -d /tmp/mlag-device.XXXXXX)
logs="$work/logs"
mkdir -p "$logs"
t0=$SECONDS
deadline=$((t0 + ${MLAG_DEVICE_DEADLINE_S:-480}))
steps="$work/steps.tsv"  # name, result, seconds, log
: >"$steps"

# step LIMIT_S NAME LOG COMMAND...: one step, under min(LIMIT_S, the time
# left before the deadline); skipped when under 10 s are left.
step() {
  local limit="$1" name="$2" log="$3"; shift 3
  local left=$((deadline - SECONDS)) start=$SECONDS result
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 10 ]; then
    printf '%s\tSKIPPED (deadline)\t0\t%s\n' "$name" "$log" >>"$steps"
    return 1
  fi
  echo "== $name (at $((SECONDS - t0)) s, limit $limit s)"
  timeout --kill-after=5 "$limit" "$@" >"$logs/$log" 2>&1
  local rc=$?
  case $rc in
    0) result=ok ;;
    124 | 137) result="TIMEOUT after $limit s" ;;
    77) result="skipped (exit 77)" ;;
    *) result="FAILED, exit $rc" ;;
  esac
  printf '%s\t%s\t%s\t%s\n' "$name" "$result" $((SECONDS - start)) "$log" >>"$steps"
  tail -3 "$logs/$log"
  return $rc
}

{
  echo "bundle: $bundle"
  head -3 "$bundle/MANIFEST" 2>/dev/null
  timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
    --format=csv,noheader
  echo "cpus: $(nproc)"
} >"$logs/machine.txt" 2>&1
cat "$logs/machine.txt"

# NCCL: the wheel's (lib/libnccl.so.2 only, include/nccl.h), else any
# libnccl.so.2 with an nccl.h near it (the toolkit's), gathered into
# $work/nccl laid out as the wheel is: what -Dnccl_dir expects.
nccl_lib="" nccl_h=""
wheel=$(timeout 20 python3 -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
if [ -n "$wheel" ] && [ -f "$wheel/lib/libnccl.so.2" ] && [ -f "$wheel/include/nccl.h" ]; then
  nccl_lib="$wheel/lib/libnccl.so.2" nccl_h="$wheel/include/nccl.h"
else
  nccl_lib=$(timeout 30 find /usr /opt -name libnccl.so.2 2>/dev/null | head -1)
  nccl_h=$(timeout 30 find /usr /opt -name nccl.h -path '*include*' 2>/dev/null | head -1)
fi
mkdir -p "$work/nccl/lib" "$work/nccl/include"
nccl_args=()
if [ -n "$nccl_lib" ] && [ -n "$nccl_h" ]; then
  ln -s "$(readlink -f "$nccl_lib")" "$work/nccl/lib/libnccl.so.2"
  ln -s "$(readlink -f "$nccl_h")" "$work/nccl/include/nccl.h"
  nccl_args=(-Dnccl_dir="$work/nccl")
fi
echo "nccl: ${nccl_lib:-none} ${nccl_h:+(header $nccl_h)}" | tee -a "$logs/machine.txt"
export LD_LIBRARY_PATH="$work/lib:$work/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"

# 1. The bundle's executables, or a fallback build.
tar -C "$work" -xzf "$bundle/bin.tgz"
bin="$work/bin"
# (A script, not a function: `timeout` runs programs.)
loads='missing=$(for f in "$1"/*; do ldd "$f" | grep "not found"; done | sort -u)
if [ -n "$missing" ]; then echo "bundled executables do not load here: $missing"; exit 1; fi
"$1/mlag" --help >/dev/null'
# MLAG_DEVICE_FALLBACK=1 builds from source even so (to try the fallback).
if [ "${MLAG_DEVICE_FALLBACK:-0}" = 1 ] ||
  ! step 30 "bundled executables load" loads.log bash -c "$loads" loads "$bin"; then
  root="$work/root"
  mkdir -p "$root" "$work/src"
  for d in "$bundle"/debs/*.deb; do dpkg -x "$d" "$root"; done
  tar -C "$work/src" -xzf "$bundle/src.tgz"
  libdirs="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/openblas-pthread"
  export LD_LIBRARY_PATH="$libdirs:$LD_LIBRARY_PATH"
  export PKG_CONFIG="$root/usr/bin/pkg-config" PKG_CONFIG_SYSROOT_DIR="$root"
  export BOOST_ROOT="$root/usr"  # Boost has no pkg-config files
  export PKG_CONFIG_LIBDIR="$root/usr/lib/x86_64-linux-gnu/pkgconfig:$root/usr/share/pkgconfig:$root/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig"
  # The machine's meson and ninja when it has them (pip's), else the bundle's.
  if command -v meson >/dev/null 2>&1; then
    meson=(meson)
  else
    export PYTHONPATH="$root/usr/lib/python3/dist-packages:${PYTHONPATH:-}"
    meson=(python3 -m mesonbuild.mesonmain)
  fi
  command -v ninja >/dev/null 2>&1 || export NINJA="$root/usr/bin/ninja"
  mapfile -t targets < <(sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$work/src/tests/gpu/device_targets.txt")
  build="$work/build"
  step 60 "fallback configure" configure.log "${meson[@]}" setup "$build" "$work/src" \
    -Dcuda=enabled -Dnvcc_arch=90 -Dmpi=disabled -Dbuildtype=release "${nccl_args[@]}" &&
    step 240 "fallback build" build.log "${NINJA:-ninja}" -C "$build" -j "$(nproc)" "${targets[@]}" &&
    { mkdir -p "$work/fallback-bin"
      for t in "${targets[@]}"; do cp "$build/$t" "$work/fallback-bin/"; done
      bin="$work/fallback-bin"; }
fi

# 2. The gpu suite.
step 60 "op harness (cuda cases)" ops_cuda.log "$bin/ops_test" --gtest_filter='cuda/*'
step 30 "graph tests (gpu_test)" gpu_test.log "$bin/gpu_test"
step 30 "mla_gpu_test" mla_gpu.log "$bin/mla_gpu_test"
step 30 "moe_linear_gpu_test" moe_linear_gpu.log "$bin/moe_linear_gpu_test"
step 90 "runtime_gpu_test" runtime_gpu.log "$bin/runtime_gpu_test"
# The suite's script: beside this one in a copied bundle, in tests/ here.
cli_test="$here/cli_cuda_test.sh"
[ -f "$cli_test" ] || cli_test="$here/../cli_cuda_test.sh"
step 60 "command line on cuda" cli_cuda.log bash "$cli_test" "$bin/mlag"
# 3. The MLA decode kernels.
step 40 "MLA decode benchmark" mla_decode_bench.log "$bin/mla_decode_bench"
# 4. Whole steps and graph nodes.
for model in small v2-lite-8l; do
  # stdout (the JSON) alone in its log; stderr beside it.
  step 120 "mlag bench $model" "bench_$model.json" bash -c '"$@" 2>"$0"' \
    "$logs/bench_$model.err" "$bin/mlag" bench --model "$model" \
    --device cuda --batch-sizes 1,32,256 --steps 10 --prefill-lens 512 --profile --json
done
# 5. Dense FP8 projections: cuBLASLt's block scaling, then the tensor-core
# GEMM it replaces (MLAG_FP8_GEMM=tc), on the same GPU.
for path in cublaslt tc; do
  step 60 "mlag bench v2-lite-8l fp8 ($path)" "bench_v2-lite-8l_fp8_$path.json" \
    env MLAG_FP8_GEMM="$path" bash -c '"$@" 2>"$0"' \
    "$logs/bench_v2-lite-8l_fp8_$path.err" "$bin/mlag" bench --model v2-lite-8l \
    --weight-dtype fp8 --device cuda --batch-sizes 1,16 --steps 10 --prefill-lens 128 \
    --profile --json
done
# 6. Programmatic dependent launch: v2-lite-8l bf16 again with plain
# launches (MLAG_PDL=0), against step 4's run with PDL.
step 60 "mlag bench v2-lite-8l without PDL" "bench_v2-lite-8l_no_pdl.json" \
  env MLAG_PDL=0 bash -c '"$@" 2>"$0"' \
  "$logs/bench_v2-lite-8l_no_pdl.err" "$bin/mlag" bench --model v2-lite-8l \
  --device cuda --batch-sizes 1,32 --steps 10 --prefill-lens 128 --profile --json

python3 "$here/device_report.py" "$work" "$OUT/summary.txt" "$OUT/figures.json"
cat "$OUT/summary.txt"
tar -C "$work" -czf "$OUT/logs.tgz" logs
rm -rf "$work"
