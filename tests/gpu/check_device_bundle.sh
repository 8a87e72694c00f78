#!/usr/bin/env bash
# Checks a device bundle (tests/gpu/make_device_bundle.sh) without a GPU:
#   1. every shared library each bundled executable (and library) loads
#      resolves inside the bundle's lib/, or is one the GPU machine keeps
#      (device_system_libs.txt);
#   2. the bundled packages are complete: every symlink in them resolves,
#      every library and program in them finds the libraries it needs among
#      them (or the system's of step 1), and the fallback build configures
#      (CUDA for sm_90, NCCL from a folder laid out as the nvidia-nccl
#      wheel's) with the bundled meson, ninja and pkg-config, and
#      PKG_CONFIG_LIBDIR restricted to the bundled packages, and every
#      dependency it finds comes from them (not from this machine's cmake
#      files or library paths);
#   3. the fetch step fails, naming it, on a package it cannot download.
# Prints each failure; exits 1 on any.
#
#   bash tests/gpu/check_device_bundle.sh [BUNDLE]   (default .device-bundle)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bundle="$(cd "${1:-$here/../../.device-bundle}" && pwd)" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
allow_prefix="^($(sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$here/device_system_libs.txt" | paste -sd'|'))"
allow="$allow_prefix\$"

# resolves_within ROOT FILE LD_LIBRARY_PATH: every library FILE loads is
# under ROOT or allowed; prints the others.
resolves_within() {
  local root="$1" file="$2"
  LD_LIBRARY_PATH="$3" ldd "$file" 2>&1 | awk '$2 == "=>" {print $1, $3}' |
    while read -r soname path; do
      [[ "$soname" =~ $allow ]] && continue
      case "$path" in
        "$root"/*) ;;
        not) echo "$soname not found" ;;
        *) echo "$soname resolves to $path, outside the bundle" ;;
      esac
    done
}

echo "== 1. the executables' libraries"
mkdir -p "$tmp/bin"
tar -C "$tmp/bin" -xzf "$bundle/bin.tgz" || bad "bin.tgz does not unpack"
n=0
for f in "$tmp"/bin/bin/* "$tmp"/bin/lib/*; do
  [ -f "$f" ] || continue
  n=$((n + 1))
  problems=$(resolves_within "$tmp/bin/lib" "$f" "$tmp/bin/lib")
  [ -z "$problems" ] || bad "$(basename "$f"): $(echo "$problems" | paste -sd';')"
done
[ -x "$tmp/bin/bin/mlag" ] || bad "the bundle has no mlag"
echo "$n executables and libraries checked"

echo "== 2. the packages of the fallback build"
root="$tmp/root"
mkdir -p "$root"
debs=("$bundle"/debs/*.deb)
[ -f "${debs[0]}" ] || bad "the bundle has no packages"
for d in "${debs[@]}"; do dpkg -x "$d" "$root" || bad "$(basename "$d") does not unpack"; done
# Library symlinks (the -dev packages' libfoo.so -> the runtime package's
# file; one to a system library's file, libz.so.1.2.13, is left to it).
while IFS= read -r link; do
  target=$(readlink "$link")
  case "$target" in /*) resolved="$root$target" ;; *) resolved="$(dirname "$link")/$target" ;; esac
  [ -e "$resolved" ] || [[ "$(basename "$target")" =~ $allow_prefix ]] ||
    bad "${link#"$root"} -> $target: no package in the bundle provides it"
done < <(find "$root/usr/lib" "$root/lib" -type l -name '*.so*' 2>/dev/null)
libdirs="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/openblas-pthread"
while IFS= read -r f; do
  [ -e "$f" ] && [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] || continue
  problems=$(resolves_within "$root" "$f" "$libdirs")
  [ -z "$problems" ] || bad "${f#"$root"}: $(echo "$problems" | paste -sd';')"
done < <(find "$root/usr/bin" "$root/usr/lib" "$root/lib" \( -type f -o -type l \) \( -name '*.so*' -o -path '*/bin/*' \) 2>/dev/null)

# The fallback configure, with nothing of this machine's packages: meson,
# ninja and pkg-config from the bundle, pkg-config files only from it.
mkdir -p "$tmp/src"
tar -C "$tmp/src" -xzf "$bundle/src.tgz" || bad "src.tgz does not unpack"
source "$tmp/src/.ci/env.sh"
nccl_args=()
if [ -f /usr/local/cuda/lib64/libnccl.so.2 ] && [ -f /usr/local/cuda/include/nccl.h ]; then
  # As the wheel has it: lib/libnccl.so.2 only, include/nccl.h.
  mkdir -p "$tmp/nccl/lib" "$tmp/nccl/include"
  ln -s /usr/local/cuda/lib64/libnccl.so.2 "$tmp/nccl/lib/"
  ln -s /usr/local/cuda/include/nccl.h "$tmp/nccl/include/"
  nccl_args=(-Dnccl_dir="$tmp/nccl")
fi
if (
  export PYTHONPATH="$root/usr/lib/python3/dist-packages"
  export NINJA="$root/usr/bin/ninja" PKG_CONFIG="$root/usr/bin/pkg-config"
  export LD_LIBRARY_PATH="$libdirs"
  export PKG_CONFIG_SYSROOT_DIR="$root"
  export BOOST_ROOT="$root/usr"  # Boost has no pkg-config files
  export PKG_CONFIG_LIBDIR="$root/usr/lib/x86_64-linux-gnu/pkgconfig:$root/usr/share/pkgconfig:$root/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig"
  cd "$tmp/src" &&
    python3 -m mesonbuild.mesonmain setup "$tmp/build" -Dcuda=$MLAG_CUDA_OPTION -Dnvcc_arch=90 \
      -Dmpi=disabled "${nccl_args[@]}"
) >"$tmp/configure.log" 2>&1; then
  if [ ${#nccl_args[@]} -gt 0 ] && ! grep -q '#define MLAG_HAVE_NCCL 1' "$tmp/build/mlag_config.h"; then
    bad "the fallback configure found no NCCL in the wheel's layout"
  fi
  # Each dependency must come from the bundle: meson also looks with cmake
  # and, for gtest and gmock, in the compiler's own library paths, which
  # would find this machine's packages, not the bundle's.
  outside=$(python3 - "$tmp/build/meson-info/intro-dependencies.json" "$root" <<'PY'
import json, sys
deps, root = json.load(open(sys.argv[1])), sys.argv[2] + "/"
# Not from packages: the toolkit's CUDA and NCCL, the C library's threads.
system = {"threads", "cuda", "nccl"}
system_libs = {"-lpthread", "-lm", "-ldl", "-lrt", "-lc", "-lstdc++", "-lgcc_s", "-latomic"}
for d in deps:
    if d["name"] in system:
        continue
    args = d.get("compile_args", []) + d.get("link_args", [])
    paths = [a[2:] if a[:2] in ("-I", "-L") else a for a in args
             if a.startswith(("-I", "-L", "/"))]
    # (The compiler's own libraries, such as libatomic, come with it.)
    foreign = [a for a in paths if not a.startswith((root, "/usr/lib/gcc/"))]
    foreign += [a for a in args if a.startswith("-l") and a not in system_libs]
    if foreign or not any(p.startswith(root) for p in paths):
        print(f"{d['name']} ({' '.join(foreign) or 'no path in the bundle'})")
PY
  )
  if [ -n "$outside" ]; then
    bad "the fallback configure found dependencies outside the bundle: $(echo "$outside" | paste -sd';')"
  else
    echo "fallback configure: ok ($(grep -c 'Run-time dependency.*found: YES' "$tmp/configure.log") dependencies found, each in the bundle)"
  fi
else
  bad "the fallback configure failed: $(grep -E 'ERROR|not found|No module' "$tmp/configure.log" | head -3 | paste -sd';')"
fi

echo "== 3. the fetch step on a package it cannot download"
echo "mlag-no-such-package" >"$tmp/list"
if bash "$here/fetch_device_deps.sh" "$tmp/fetch" "$tmp/list" >"$tmp/fetch.log" 2>&1; then
  bad "fetch_device_deps.sh succeeded with an unknown package"
elif ! grep -q "mlag-no-such-package" "$tmp/fetch.log"; then
  bad "fetch_device_deps.sh failed without naming the package: $(tail -2 "$tmp/fetch.log")"
else
  echo "fetch of an unknown package: failed, naming it"
fi
[ $fail -eq 0 ] && echo "device bundle: ok"
exit $fail
