#!/usr/bin/env bash
# Fails when a tracked C, C++ or CUDA source (headers and included .inc
# files too) differs from .clang-format's style, listing the files.
# Skipped (exit 77) without clang-format or outside a git checkout. Fix with:
#   git ls-files '*.cc' '*.h' '*.inc' '*.cu' '*.cuh' '*.c' | xargs clang-format -i
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "format skipped: no clang-format"; exit 77
fi
if ! files=$(git ls-files '*.cc' '*.h' '*.inc' '*.cu' '*.cuh' '*.c' 2>/dev/null) || [ -z "$files" ]; then
  echo "format skipped: not a git checkout"; exit 77
fi
clang-format --version
bad=()
for f in $files; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -ne 0 ]; then
  echo "not formatted (${#bad[@]} files):"; printf '  %s\n' "${bad[@]}"; exit 1
fi
echo "$(echo "$files" | wc -l) files formatted"
