#!/usr/bin/env bash
# Starts N expert-parallel ranks of `mlag run` with mpirun, one process per
# rank (--ep N --ep-backend mpi). Each rank runs where --device says: host
# ranks talk over MPI; with --device cuda (or auto on a machine with GPUs)
# rank r takes the GPU of its local rank and moves data over NCCL,
# bootstrapped over MPI. Rank 0 prints the run's output.
#
#   examples/launch_ep.sh N [mlag run flags...]
#   examples/launch_ep.sh 4 --model tiny-v2 --num-requests 40 --max-tokens 24 --json
#   examples/launch_ep.sh 4 --device cuda --model tiny-v2 --num-requests 40 --max-tokens 24
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
# Ranks share the cores: split the host worker threads between them.
threads=$(( cores / N )); [ "$threads" -ge 1 ] || threads=1
exec mpirun "${args[@]}" ${MPIRUN_ARGS:-} -x MLAG_NUM_THREADS="$threads" \
  "$MLAG" run --ep "$N" --ep-backend mpi "$@"
