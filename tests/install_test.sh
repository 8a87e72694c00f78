#!/usr/bin/env bash
# The installed library as a user gets it: `meson install` into a staging
# directory, then examples/embed.c built outside the tree with
#   cc embed.c $(pkg-config --cflags --libs mlagraph)
# and run; its tokens must be those of the in-tree embed. Also checks that
# libmlagraph.so exports the mlag_* functions only and has a versioned soname.
#
# Usage: install_test.sh BUILD_DIR SOURCE_DIR IN_TREE_EMBED
set -euo pipefail
BUILD=$(cd "$1" && pwd)
SRC=$(cd "$2" && pwd)
IN_TREE_EMBED=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
ok() { echo "ok: $1"; }
bad() { echo "FAIL: $1"; fails=$((fails + 1)); }

meson install -C "$BUILD" --no-rebuild --destdir "$TMP/stage" --quiet
pc=$(find "$TMP/stage" -name mlagraph.pc | head -n 1)
lib=$(find "$TMP/stage" -name 'libmlagraph.so' | head -n 1)
[ -n "$pc" ] && ok "mlagraph.pc installed" || bad "no mlagraph.pc under the staging prefix"
[ -n "$lib" ] && ok "libmlagraph.so installed" || bad "no libmlagraph.so under the staging prefix"
[ -n "$(find "$TMP/stage" -path '*/include/mlagraph/mlagraph.h')" ] && ok "header installed" ||
  bad "no include/mlagraph/mlagraph.h"
[ -n "$(find "$TMP/stage" -path '*/bin/mlag')" ] && ok "mlag installed" || bad "no bin/mlag"
[ "$fails" -eq 0 ] || exit 1

# The pkg-config file names the final prefix; the sysroot points it into
# the staging directory.
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_SYSROOT_DIR="$TMP/stage"
mkdir "$TMP/outside"
cp "$SRC/examples/embed.c" "$TMP/outside/"
# shellcheck disable=SC2046  # pkg-config's flags are words
if (cd "$TMP/outside" && cc -std=c99 -Wall -Wextra -pedantic -Werror embed.c \
      $(pkg-config --cflags --libs mlagraph) -o embed) 2>"$TMP/cc.err"; then
  ok "embed.c built outside the tree through pkg-config"
else
  bad "cc embed.c \$(pkg-config --cflags --libs mlagraph): $(cat "$TMP/cc.err")"
  exit 1
fi
if LD_LIBRARY_PATH=$(dirname "$lib") "$TMP/outside/embed" >"$TMP/out.txt" 2>"$TMP/err.txt"; then
  ok "installed embed ran"
else
  bad "installed embed failed: $(cat "$TMP/err.txt")"
fi
"$IN_TREE_EMBED" >"$TMP/in_tree.txt"
if [ -s "$TMP/out.txt" ] && cmp -s "$TMP/out.txt" "$TMP/in_tree.txt"; then
  ok "same tokens as the in-tree embed"
else
  bad "tokens differ: $(cat "$TMP/out.txt") vs $(cat "$TMP/in_tree.txt")"
fi

# Exports: the C ABI only.
others=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^mlag_' || true)
if [ -z "$others" ]; then ok "exports mlag_* only"; else bad "exports beyond the C API: $(echo "$others" | head -5)"; fi
nm -D --defined-only "$lib" | grep -q ' mlag_engine_create$' && ok "exports mlag_engine_create" ||
  bad "mlag_engine_create not exported"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
case "$soname" in
  libmlagraph.so.[0-9]*) ok "soname $soname" ;;
  *) bad "soname '$soname' is not versioned" ;;
esac

[ "$fails" -eq 0 ] && echo "install: all passed" || { echo "install: $fails failed"; exit 1; }
