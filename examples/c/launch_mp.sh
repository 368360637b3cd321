#!/usr/bin/env bash
# Start an example N times as a launcher would (torchrun, mpirun, Slurm): every process gets
# SYMM_COMM_ID (the bootstrap root's address, which rank 0 opens), SYMM_RANK and
# SYMM_WORLD_SIZE. Fails if any rank fails.
# usage: launch_mp.sh NRANKS PROGRAM [ARGS...]
set -euo pipefail
nranks=$1
shift
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export SYMM_COMM_ID="127.0.0.1:$port" SYMM_WORLD_SIZE="$nranks"
pids=()
for ((rank = 0; rank < nranks; rank++)); do
  SYMM_RANK=$rank "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || status=1
done
exit $status
