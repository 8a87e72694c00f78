#!/usr/bin/env bash
# Sets up, builds and runs every test: the main build (CUDA compiled when
# nvcc is present; gpu tests skip without a device), then the host code once
# more under AddressSanitizer + UndefinedBehaviorSanitizer.
#
#   bash tests/run.sh                 # both builds
#   MLAG_SKIP_SANITIZE=1 bash tests/run.sh   # main build only
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install-deps
source .ci/env.sh

summary_file=$(mktemp)
trap 'rm -f "$summary_file"' EXIT

run_suite() {
  local dir="$1"
  local log
  log=$(mktemp)
  set +e
  meson test -C "$dir" --print-errorlogs --num-processes 2 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  awk '/^Ok:/{ok=$2} /^Fail:/{f=$2} /^Skipped:/{s=$2} /^Timeout:/{t=$2} END{print ok+0, f+t, s+0}' "$log" >> "$summary_file"
  rm -f "$log"
  return $rc
}

status=0
echo "== main build (cuda: $MLAG_CUDA_OPTION) =="
mlag_setup build -Dcuda=$MLAG_CUDA_OPTION
meson compile -C build
run_suite build || status=1
if [ "$MLAG_CUDA_OPTION" = enabled ]; then
  echo "== CUDA register / spill report (sm_90) =="
  bash kernels/cuda/spill_report.sh 90 || status=1
fi

if [ "${MLAG_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== host build with AddressSanitizer + UndefinedBehaviorSanitizer =="
  # MPI is off here: OpenMPI's own start-up allocations would be reported as
  # leaks; the MPI tests run in the main build.
  mlag_setup build-asan -Dcuda=disabled -Dmpi=disabled -Db_sanitize=address,undefined \
    -Dbuildtype=debugoptimized -Db_lundef=false
  meson compile -C build-asan
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  run_suite build-asan || status=1
fi

awk '{p+=$1; f+=$2; s+=$3} END{printf "tests: %d passed, %d failed, %d skipped\n", p, f, s}' "$summary_file"
exit $status
