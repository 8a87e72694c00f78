#!/usr/bin/env bash
# Builds, on this machine (no GPU needed), everything one GPU session needs,
# into .device-bundle/ (git-ignored; carry it to the GPU machine):
#   bin.tgz      the gpu suite's executables and mlag (release, SASS for
#                sm_90 plus PTX), bin/, and every shared library they load
#                but the GPU machine's own (device_system_libs.txt), lib/;
#   scripts/     run_device_checks.sh and the scripts the suite runs;
#   src.tgz      the source tree, for a fallback build there;
#   debs/        the Debian packages that fallback build needs
#                (device_packages.txt), the complete set;
#   MANIFEST     commit, build options, binaries, libraries and packages.
# Then, on the GPU machine: bash tests/gpu/run_device_checks.sh (or
# bash .device-bundle/scripts/run_device_checks.sh, the bundle copied alone).
#
#   bash tests/gpu/make_device_bundle.sh [--build-dir DIR] [--out DIR]
#     --build-dir  an existing CUDA build to take the executables from (CI
#                  passes its main build); default: build-device, configured
#                  here as a release CUDA build for sm_90 without MPI.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"
build=build-device
out=.device-bundle
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "make_device_bundle: unknown argument $1" >&2; exit 2 ;;
  esac
done
t0=$SECONDS
bash .ci/install-deps
source .ci/env.sh
if [ "$MLAG_CUDA_OPTION" != enabled ]; then
  echo "make_device_bundle: no nvcc: the bundle's executables need the CUDA toolkit" >&2
  exit 1
fi
mapfile -t targets < <(sed 's/#.*//; s/[[:space:]]//g; /^$/d' tests/gpu/device_targets.txt)
if [ "$build" = build-device ]; then
  mlag_setup build-device -Dcuda=enabled -Dnvcc_arch=90 -Dmpi=disabled -Dbuildtype=release
fi
# The build's options, checked: real CUDA (not the emulation) for sm_90.
options="$(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print("buildtype=%s cuda=%s emulate_cuda=%s nvcc_arch=%s mpi=%s" % (o["buildtype"], o["cuda"],
      str(o["emulate_cuda"]).lower(), ",".join(o["nvcc_arch"]), o["mpi"]))')"
case " $options " in
  *" emulate_cuda=true "* | *" cuda=disabled "* | *" buildtype=debug "*)
    echo "make_device_bundle: $build is not a CUDA release build: $options" >&2; exit 1 ;;
esac
sm90='nvcc_arch=([0-9]+,)*90[ ,]'
[[ " $options " =~ $sm90 ]] || {
  echo "make_device_bundle: $build builds no sm_90 SASS: $options" >&2; exit 1; }
ninja -C "$build" "${targets[@]}"

rm -rf "$out"
mkdir -p "$out/stage/bin" "$out/stage/lib" "$out/scripts"
for t in "${targets[@]}"; do cp "$build/$t" "$out/stage/bin/"; done
# Every library the executables load (ldd: the transitive closure), copied
# under its soname unless the GPU machine has its own.
allow="^($(sed 's/#.*//; s/[[:space:]]//g; /^$/d' tests/gpu/device_system_libs.txt | paste -sd'|'))\$"
for exe in "$out"/stage/bin/*; do
  ldd "$exe" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  if ! [[ "$soname" =~ $allow ]]; then cp -L "$path" "$out/stage/lib/$soname"; fi
done
tar -C "$out/stage" -czf "$out/bin.tgz" bin lib
cp tests/gpu/run_device_checks.sh tests/gpu/device_report.py tests/cli_cuda_test.sh "$out/scripts/"
# (Tracked files deleted from the work tree are left out.)
git ls-files -co --exclude-standard -z |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -czf "$out/src.tgz" -T -
bash tests/gpu/fetch_device_deps.sh "$out/debs" >/dev/null
{
  echo "commit: $(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "build: $build ($options)"
  echo "binaries: $(ls "$out/stage/bin" | tr '\n' ' ')"
  echo "libraries: $(ls "$out/stage/lib" | tr '\n' ' ')"
  echo "packages: $(ls "$out/debs" | tr '\n' ' ')"
} >"$out/MANIFEST"
rm -rf "$out/stage"
echo "make_device_bundle: $out, $(du -sh "$out" | cut -f1) ($(du -sh "$out/bin.tgz" | cut -f1) executables and libraries, $(du -sh "$out/debs" | cut -f1) packages, $(du -sh "$out/src.tgz" | cut -f1) source), in $((SECONDS - t0)) s"
