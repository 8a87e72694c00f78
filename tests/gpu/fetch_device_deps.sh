#!/usr/bin/env bash
# Downloads the .deb files of tests/gpu/device_packages.txt (amd64, from the
# machine's Debian mirror) into DIR, for the device bundle: the GPU machine
# reaches no mirror. Fails, naming them, when any package is not fetched.
#
#   bash tests/gpu/fetch_device_deps.sh DIR [LIST]   (LIST: another list file)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${1:?usage: fetch_device_deps.sh DIR}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
list="${2:-$here/device_packages.txt}"
mapfile -t packages < <(sed 's/#.*//; s/[[:space:]]//g; /^$/d' "$list")

as_root=()
if [ "$(id -u)" -ne 0 ]; then as_root=(sudo); fi
download() {
  (cd "$dir" && apt-get download -q=2 "$@")
}
# One call for all (fast); when it fails (stale package lists), the lists
# are updated and the call repeated, its error shown.
if ! download "${packages[@]}" 2>/dev/null; then
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  download "${packages[@]}"
fi
missing=()
for p in "${packages[@]}"; do
  compgen -G "$dir/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "fetch_device_deps: not downloaded: ${missing[*]}" >&2
  exit 1
fi
echo "fetch_device_deps: ${#packages[@]} packages, $(du -sh "$dir" | cut -f1) in $dir"
