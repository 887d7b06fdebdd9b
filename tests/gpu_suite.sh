#!/usr/bin/env bash
# The GPU suite (pytest -m gpu) as N interleaved shards run side by side: kernel compilation,
# single-threaded per process, dominates the suite, and one GPU serves every shard ($GPUS of them
# in turn where set).
#   tests/gpu_suite.sh [N] [pytest args]      (N = 12 by default; logs under $LOGDIR)
# Exits non-zero when any shard fails or is killed at its time limit ($LIMIT seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-12}
shift || true
LOGDIR=${LOGDIR:-/tmp/fxflash_gpu_suite}
LIMIT=${LIMIT:-1800}
PY=${PYTHON:-python}
GPUS=${GPUS:-1}
mkdir -p "$LOGDIR"
export FXFLASH_AUTOTUNE=${FXFLASH_AUTOTUNE:-0}
start=$(date +%s)
pids=()
for ((i = 0; i < N; i++)); do
  CUDA_VISIBLE_DEVICES=$((i % GPUS)) timeout "$LIMIT" "$PY" -m pytest -m gpu tests/test_gpu.py --shard "$i/$N" -q -p no:cacheprovider -rfEs \
    --durations=5 "$@" > "$LOGDIR/shard_$i.log" 2>&1 &
  pids+=($!)
done
status=0
for ((i = 0; i < N; i++)); do
  wait "${pids[$i]}"
  rc=$?
  [ $rc -eq 0 ] || { status=1; echo "shard $i/$N FAILED (exit $rc; $LOGDIR/shard_$i.log)"; }
  echo "shard $i/$N: $(tail -n 1 "$LOGDIR/shard_$i.log")"
done
echo "$N shards in $(( $(date +%s) - start )) s, logs in $LOGDIR"
exit $status
