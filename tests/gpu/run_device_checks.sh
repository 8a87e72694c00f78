#!/usr/bin/env bash
# The GPU checks of one device session, under 8 minutes on one H200:
#   1. configure and build with CUDA for sm_90 (dependencies unpacked from
#      .devdeps, prepared here by tests/gpu/fetch_device_deps.sh: the GPU
#      machine reaches no package registry),
#   2. the gpu test suite (every CUDA op against its host kernel, graph replay
#      vs eager, dummy replays vs live KV pages),
#   3. the spill report,
#   4. mlag bench --device cuda on `small` and on `v2-lite-8l` (V2-Lite shapes,
#      8 of its 27 layers) at batch 1 to 256,
#   5. the MLA decode kernel benchmark (b=128, s=4096, H=16), each decode
#      kernel (f32, tensor_core, tensor_core_bf16q) against the
#      device-to-device copy bandwidth of the same run,
# logging everything under $OUT and printing a short table last.
#
#   device run: carry [".devdeps"], command "bash tests/gpu/run_device_checks.sh"
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/mlag-device-checks}"
mkdir -p "$OUT"
log="$OUT/device_checks.log"
exec > >(tee -a "$log") 2>&1
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 )) s)"; }
summary=()

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nproc

step "dependencies"
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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
command -v meson ninja pkg-config nvcc || true

step "configure and build (sm_90)"
if [ ! -f build-gpu/build.ninja ]; then
  meson setup build-gpu -Dcuda=enabled -Dnvcc_arch=90 -Dmpi=auto >"$OUT/configure.log" 2>&1 \
    || { tail -30 "$OUT/configure.log"; echo "configure failed"; exit 1; }
fi
if ninja -C build-gpu -j 16 >"$OUT/build.log" 2>&1; then
  summary+=("build: ok")
else
  tail -40 "$OUT/build.log"; echo "build failed"; exit 1
fi

step "gpu test suite"
if meson test -C build-gpu --suite gpu --print-errorlogs --num-processes 1 >"$OUT/gpu_tests.log" 2>&1; then
  summary+=("gpu suite: pass")
else
  summary+=("gpu suite: FAIL (see gpu_tests.log)")
fi
grep -E "^ *[0-9]+/[0-9]+ |Ok:|Fail:|Skipped:" "$OUT/gpu_tests.log"

step "spill report"
bash kernels/cuda/spill_report.sh 90 >"$OUT/spill_report.txt" 2>&1 && summary+=("spill: none in MLA/MoE") \
  || summary+=("spill: FOUND (see spill_report.txt)")
tail -3 "$OUT/spill_report.txt"

step "MLA decode kernel benchmark"
./build-gpu/tests/mla_decode_bench | tee "$OUT/mla_decode_bench.txt"
while IFS= read -r line; do summary+=("$line"); done < <(grep '^mla_decode\[' "$OUT/mla_decode_bench.txt" || echo 'mla_decode bench: no result')

step "mlag bench --device cuda"
for model in small v2-lite-8l; do
  timeout 150 ./build-gpu/examples/mlag bench --model "$model" --device cuda \
    --batch-sizes 1,2,4,8,16,32,64,128,256 --steps 10 >"$OUT/bench_$model.txt" 2>&1 \
    || echo "bench $model did not finish"
  cat "$OUT/bench_$model.txt"
  summary+=("bench $model: $(awk '$1 == 1 || $1 == 32 || $1 == 256 {printf "b=%s %s tok/s (%s of bw); ", $1, $5, $11}' "$OUT/bench_$model.txt")")
done

step "summary ($(( $(date +%s) - t0 )) s in all)"
for line in "${summary[@]}"; do echo "  $line"; done
