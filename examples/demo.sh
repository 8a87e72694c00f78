#!/usr/bin/env bash
# Sets up, builds and runs the demo on the built-in model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install-deps
source .ci/env.sh
mlag_setup build -Dcuda=$MLAG_CUDA_OPTION
meson compile -C build
./build/examples/mlag-graph-demo auto
