#!/usr/bin/env bash
# The GPU checks of one device session, at most 8 minutes on one H200: every
# step runs under its own timeout (470 s together), so a hang costs at most
# that step:
#   1. configure (CUDA for sm_90, MPI off) and build only the targets run
#      here (dependencies unpacked from .devdeps, prepared where a package
#      mirror is reachable by tests/gpu/fetch_device_deps.sh);
#   2. the gpu test suite (every CUDA op of the op harness against its
#      reference, graph replay vs eager, dummy replays vs live KV pages,
#      NCCL expert parallelism when several GPUs are present);
#   3. the MLA decode kernel benchmark (b=128, s=4096, 16 heads: each decode
#      kernel against the device-to-device copy bandwidth of the same run);
#   4. mlag bench --device cuda on `small` and `v2-lite-8l`.
# The spill report is left to CI (it needs no GPU). Logs and one summary
# table go under $OUT.
#
#   device run: carry [".devdeps"], command "bash tests/gpu/run_device_checks.sh",
#   timeout_s 540
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/mlag-device-checks}"
mkdir -p "$OUT"
log="$OUT/device_checks.log"
exec > >(tee -a "$log") 2>&1
t0=$(date +%s)
summary=()
note() { summary+=("$(printf '%-28s %s' "$1" "$2")"); }
# run LIMIT_S NAME LOGFILE COMMAND...: one step under its own timeout.
run() {
  local limit="$1" name="$2" out="$3"; shift 3
  echo
  echo "== $name (at $(( $(date +%s) - t0 )) s, limit $limit s)"
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$out" 2>&1
  local rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    note "$name" "TIMEOUT after $limit s (see $out)"
  elif [ $rc -ne 0 ]; then
    note "$name" "FAILED, exit $rc (see $out)"
  else
    note "$name" "ok"
  fi
  tail -5 "$OUT/$out"
  return $rc
}

echo "== machine"
timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nproc

# Dependencies the bare machine lacks, unpacked into a private root.
root=/tmp/devroot
mkdir -p "$root"
if [ -d .devdeps ]; then
  for f in .devdeps/*.deb; do dpkg -x "$f" "$root"; done
fi
export PATH="$root/usr/bin:/usr/local/cuda/bin:$PATH"
export PKG_CONFIG_SYSROOT_DIR="$root"
export PKG_CONFIG_PATH="$root/usr/lib/x86_64-linux-gnu/pkgconfig:$root/usr/share/pkgconfig:$root/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig"
export CPATH="$root/usr/include:$root/usr/include/x86_64-linux-gnu:$root/usr/include/x86_64-linux-gnu/openblas-pthread"
export LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/openblas-pthread"
export LD_LIBRARY_PATH="$LIBRARY_PATH:${LD_LIBRARY_PATH:-}"
if command -v meson >/dev/null 2>&1; then
  MESON=(meson)
elif python3 -c 'import mesonbuild' 2>/dev/null; then
  MESON=(python3 -m mesonbuild.mesonmain)
else
  # Debian's meson package installs the module under dist-packages.
  export PYTHONPATH="$root/usr/lib/python3/dist-packages:${PYTHONPATH:-}"
  MESON=(python3 -m mesonbuild.mesonmain)
fi
echo "meson: ${MESON[*]}; $(command -v ninja nvcc | tr '\n' ' ')"

targets=(tests/ops_test tests/runtime_gpu_test tests/mla_gpu_test tests/moe_linear_gpu_test
         tests/gpu_test tests/mla_decode_bench examples/mlag)
if [ ! -f build-gpu/build.ninja ]; then
  run 45 "configure (sm_90)" configure.log \
    "${MESON[@]}" setup build-gpu -Dcuda=enabled -Dnvcc_arch=90 -Dmpi=disabled || {
      for line in "${summary[@]}"; do echo "  $line"; done; exit 1; }
fi
run 170 "build" build.log ninja -C build-gpu -j 16 "${targets[@]}" || {
  for line in "${summary[@]}"; do echo "  $line"; done; exit 1; }

# The gpu suite, each executable under its own limit.
run 50 "op harness (cuda cases)" ops_cuda.log ./build-gpu/tests/ops_test --gtest_filter='cuda/*'
run 15 "graph tests (gpu_test)" gpu_test.log ./build-gpu/tests/gpu_test
run 15 "mla_gpu_test" mla_gpu.log ./build-gpu/tests/mla_gpu_test
run 15 "moe_linear_gpu_test" moe_linear_gpu.log ./build-gpu/tests/moe_linear_gpu_test
run 50 "runtime_gpu_test" runtime_gpu.log ./build-gpu/tests/runtime_gpu_test

run 30 "MLA decode benchmark" mla_decode_bench.txt ./build-gpu/tests/mla_decode_bench
while IFS= read -r line; do summary+=("  $line"); done < <(grep '^mla_decode\[' "$OUT/mla_decode_bench.txt")

for model in small v2-lite-8l; do
  run 40 "mlag bench $model" "bench_$model.txt" ./build-gpu/examples/mlag bench --model "$model" \
    --device cuda --batch-sizes 1,8,32,128,256 --steps 10
  summary+=("  $(awk '$1 == 1 || $1 == 32 || $1 == 256 {printf "b=%s %s tok/s (%s of bw); ", $1, $5, $11}' "$OUT/bench_$model.txt")")
done

echo
echo "== summary ($(( $(date +%s) - t0 )) s in all)" | tee "$OUT/summary.txt"
for line in "${summary[@]}"; do echo "  $line"; done | tee -a "$OUT/summary.txt"
