#!/usr/bin/env bash
# Sets up, builds and runs every test, in three builds:
#   build       the main build (CUDA compiled when nvcc is present; the gpu
#               suite skips without a device), every suite;
#   build-emu   the CUDA backend against its CPU emulation
#               (-Demulate_cuda=true): the gpu and emulation suites, so the
#               CUDA runtime, cuBLASLt and NCCL paths run without a GPU;
#   build-asan  the host code again under AddressSanitizer +
#               UndefinedBehaviorSanitizer.
# With nvcc, the main build also yields the GPU device bundle, which is
# checked here without a GPU (tests/gpu/check_device_bundle.sh).
#
#   bash tests/run.sh                        # all three
#   MLAG_SKIP_EMULATION=1 bash tests/run.sh  # without build-emu
#   MLAG_SKIP_SANITIZE=1 bash tests/run.sh   # without build-asan
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install-deps
source .ci/env.sh

summary=$(mktemp)
trap 'rm -f "$summary"' EXIT

# Runs the tests of build dir $1 (more meson test arguments after it) and
# appends "<dir> passed failed skipped seconds" from meson's testlog.json.
run_suite() {
  local dir="$1"; shift
  local start=$SECONDS rc=0
  meson test -C "$dir" --print-errorlogs --num-processes 2 "$@" || rc=$?
  python3 - "$dir" "$((SECONDS - start))" >>"$summary" <<'PY'
import json, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
with open(sys.argv[1] + "/meson-logs/testlog.json") as log:
    for line in log:
        result = json.loads(line)["result"]
        if result in ("OK", "EXPECTEDFAIL"):
            counts["passed"] += 1
        elif result == "SKIP":
            counts["skipped"] += 1
        else:
            counts["failed"] += 1
print(sys.argv[1], counts["passed"], counts["failed"], counts["skipped"], sys.argv[2])
PY
  return $rc
}

# The files (relative to build dir $1) of every executable the gpu and
# emulation suites run: their declared dependencies and the build outputs
# named on their command lines (the mlag binary the CLI scripts drive).
emu_suite_targets() {
  python3 - "$1" <<'PY'
import json, os, subprocess, sys
d = sys.argv[1]
def introspect(what):
    return json.loads(subprocess.check_output(["meson", "introspect", d, what]))
targets = introspect("--targets")
by_id = {t["id"]: t for t in targets}
by_file = {f: t for t in targets for f in t["filename"]}
want = set()
for test in introspect("--tests"):
    if not {"mlagraph:gpu", "mlagraph:emulation"} & set(test["suite"]):
        continue
    for i in test.get("depends", []):
        want.update(by_id[i]["filename"] if i in by_id else [])
    for arg in test["cmd"]:
        want.update(by_file[arg]["filename"] if arg in by_file else [])
root = os.path.abspath(d)
print(" ".join(sorted(os.path.relpath(f, root) for f in want)))
PY
}

status=0
echo "== main build (cuda: $MLAG_CUDA_OPTION) =="
mlag_setup build -Dcuda=$MLAG_CUDA_OPTION
meson compile -C build
run_suite build || status=1
if [ "$MLAG_CUDA_OPTION" = enabled ]; then
  echo "== CUDA register / spill report (sm_90) =="
  bash kernels/cuda/spill_report.sh 90 || status=1
  echo "== device bundle of the main build, checked without a GPU =="
  # What a GPU session carries (tests/gpu/make_device_bundle.sh), made from
  # the main build (release, sm_90); the check proves it loads and that its
  # fallback build finds every dependency on a bare machine.
  bundle_start=$SECONDS
  if bash tests/gpu/make_device_bundle.sh --build-dir build --out build/device-bundle &&
    bash tests/gpu/check_device_bundle.sh build/device-bundle; then
    echo "bundle 1 0 0 $((SECONDS - bundle_start))" >>"$summary"
  else
    echo "bundle 0 1 0 $((SECONDS - bundle_start))" >>"$summary"
    status=1
  fi
fi

if [ "${MLAG_SKIP_EMULATION:-0}" != 1 ]; then
  echo "== CUDA backend on the CPU emulation (-Demulate_cuda=true): gpu and emulation suites =="
  mlag_setup build-emu -Demulate_cuda=true
  # Only what those two suites run: the host suites ran in the main build.
  ninja -C build-emu $(emu_suite_targets build-emu)
  run_suite build-emu --no-rebuild --suite gpu --suite emulation || status=1
fi

if [ "${MLAG_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== host build with AddressSanitizer + UndefinedBehaviorSanitizer =="
  # MPI is off here: OpenMPI's own start-up allocations would be reported as
  # leaks; the MPI tests run in the main build.
  # -O1 with line tables only (-g1): what ASan recommends, and half the
  # compile time of -O2 -g, which made this build the longest part of CI.
  mlag_setup build-asan -Dcuda=disabled -Dmpi=disabled -Db_sanitize=address,undefined \
    -Dbuildtype=plain -Doptimization=1 -Db_ndebug=false -Dcpp_args=-g1 -Dc_args=-g1 \
    -Db_lundef=false
  meson compile -C build-asan
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
  run_suite build-asan || status=1
fi

awk '{printf "%-11s %3d passed, %d failed, %2d skipped in %4d s\n", $1, $2, $3, $4, $5;
      p+=$2; f+=$3; s+=$4}
     END{printf "tests: %d passed, %d failed, %d skipped\n", p, f, s}' "$summary"
exit $status
