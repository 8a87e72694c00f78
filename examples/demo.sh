#!/usr/bin/env bash
# Sets up, builds and runs the demo: mlag run on the built-in tiny-v3 model
# (seeded random weights, no download), printing each request's tokens and
# the run summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install-deps
source .ci/env.sh
mlag_setup build -Dcuda=$MLAG_CUDA_OPTION
meson compile -C build
./build/examples/mlag run --model tiny-v3 --num-requests 16 --prompt-len 96 \
  --shared-prefix-len 64 --max-tokens 16 --seed 1
