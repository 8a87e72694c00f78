#!/usr/bin/env bash
# Register and spill report of every CUDA kernel (ptxas -v) at the build's
# target architectures. Fails when a kernel of the families that must not
# spill (mla_decode / MLA attention, mla_kv_update, MoE) shows spill stores.
#
#   kernels/cuda/spill_report.sh [ARCH ...]      (default: 90)
#   meson compile -C build spill-report          (the build's nvcc_arch)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
archs=("$@"); [ ${#archs[@]} -gt 0 ] || archs=(90)
NVCC="${NVCC:-nvcc}"
command -v "$NVCC" >/dev/null 2>&1 || NVCC=/usr/local/cuda/bin/nvcc
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# A minimal config header for the standalone compile.
printf '#pragma once\n#define MLAG_HAVE_CUDA 1\n' >"$tmp/mlag_config.h"
# Compile every file at every architecture, as many at once as there are
# cores (each nvcc is single-threaded), then read the logs in order.
jobs=()
for cu in "$root"/kernels/cuda/*.cu; do
  for arch in "${archs[@]}"; do jobs+=("$cu" "$arch"); done
done
compile_one() {
  local cu="$1" arch="$2" name
  name=$(basename "$cu" .cu)
  "$NVCC" -std=c++17 --expt-relaxed-constexpr -I"$root" -I"$tmp" \
    -gencode=arch=compute_${arch},code=sm_${arch} -Xptxas -v -c "$cu" -o "$tmp/$name.$arch.o" \
    >"$tmp/$name.$arch.log" 2>&1 || echo "$cu" >>"$tmp/failed.$name.$arch"
}
export -f compile_one
export NVCC root tmp
printf '%s\0' "${jobs[@]}" | xargs -0 -n 2 -P "$(nproc)" bash -c 'compile_one "$@"' _
status=0
printf '%-44s %-6s %5s %12s %11s %s\n' "kernel" "arch" "regs" "spill stores" "spill loads" "file"
for cu in "$root"/kernels/cuda/*.cu; do
  name=$(basename "$cu" .cu)
  for arch in "${archs[@]}"; do
    log="$tmp/$name.$arch.log"
    if [ -e "$tmp/failed.$name.$arch" ]; then
      echo "compile failed: $cu"; cat "$log"; exit 1
    fi
    # ptxas prints, per entry: "Compiling entry function 'X'", then a line
    # with "N bytes spill stores, M bytes spill loads", then "Used R registers".
    awk -v file="$name.cu" -v arch="sm_$arch" '
      /Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); fn = substr($0, RSTART + 1, RLENGTH - 2) }
      /spill stores/ { for (i = 1; i <= NF; ++i) { if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "stores,") st = $i; if ($(i+1) == "bytes" && $(i+2) == "spill" && $(i+3) == "loads") ld = $i } }
      /Used [0-9]+ registers/ { match($0, /Used [0-9]+ registers/); regs = substr($0, RSTART + 5, RLENGTH - 15);
        if (fn != "") printf "%s\t%s\t%s\t%s\t%s\t%s\n", fn, arch, regs, st + 0, ld + 0, file; fn = "" }
    ' "$log" >"$tmp/$name.$arch.tsv"
    while IFS=$'\t' read -r fn a regs st ld file; do
      pretty=$(echo "$fn" | c++filt 2>/dev/null | sed -e 's/(anonymous namespace):://g' -e 's/^void //' -e 's/mlag::cuda:://g' -e 's/mlag:://g' | sed -E 's/\(.*//')
      printf '%-44s %-6s %5s %12s %11s %s\n' "${pretty:0:44}" "$a" "$regs" "$st" "$ld" "$file"
      case "$file" in
        mla_attention.cu|mla_kv_update.cu|moe.cu)
          if [ "$st" != "0" ]; then echo "  ^ spill stores in a kernel that must not spill"; status=1; fi ;;
      esac
    done <"$tmp/$name.$arch.tsv"
  done
done
if [ "$status" -eq 0 ]; then echo "spill report: no spill stores in mla_attention, mla_kv_update or moe kernels"; fi
exit $status
