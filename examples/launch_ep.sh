#!/usr/bin/env bash
# Starts N expert-parallel ranks of `mlag run` with mpirun, one process per
# rank: one GPU per rank when GPUs are present (--device cuda:LOCAL_RANK),
# host ranks otherwise. Rank 0 prints the run's output.
#
#   examples/launch_ep.sh N [mlag run flags...]
#   examples/launch_ep.sh 4 --model tiny-v2 --num-requests 40 --max-tokens 24 --json
#
# Environment: MLAG (path of the mlag binary, default build/examples/mlag),
# MPIRUN_ARGS (extra mpirun arguments, e.g. a hostfile).
set -euo pipefail
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
  echo "usage: $0 N [mlag run flags...]" >&2
  exit 2
fi
N="$1"; shift
here="$(cd "$(dirname "$0")/.." && pwd)"
MLAG="${MLAG:-$here/build/examples/mlag}"
if [ ! -x "$MLAG" ]; then
  echo "$0: $MLAG not found: build first (bash examples/demo.sh or meson compile -C build)" >&2
  exit 2
fi
if ! command -v mpirun >/dev/null 2>&1; then
  echo "$0: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)" >&2
  exit 2
fi
args=(-np "$N")
if [ "$(id -u)" -eq 0 ]; then args+=(--allow-run-as-root); fi
cores=$(nproc)
if [ "$N" -gt "$cores" ]; then args+=(--oversubscribe); fi
# Host ranks share the cores: split OpenMP threads between them.
threads=$(( cores / N )); [ "$threads" -ge 1 ] || threads=1
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l || echo 0)
fi
device_flag=()
if [ "$gpus" -ge "$N" ]; then
  # One GPU per rank: each process picks its local rank's device.
  exec mpirun "${args[@]}" ${MPIRUN_ARGS:-} -x OMP_NUM_THREADS="$threads" \
    bash -c 'exec "$0" run --device "cuda:${OMPI_COMM_WORLD_LOCAL_RANK:-0}" "$@"' \
    "$MLAG" --ep "$N" --ep-backend mpi "$@"
fi
exec mpirun "${args[@]}" ${MPIRUN_ARGS:-} -x OMP_NUM_THREADS="$threads" -x OMP_WAIT_POLICY=passive \
  "$MLAG" run --device host --ep "$N" --ep-backend mpi "$@"
