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
EXTRA=("$@")
shard() {
  timeout "$LIMIT" "$PY" -m pytest -m gpu tests/test_gpu.py --shard "$1/$N" -q -p no:cacheprovider -rfEs \
    --durations=5 "${EXTRA[@]}"
}
source tests/shards.sh
start=$(date +%s)
run_shards "$N"
echo "$N shards in $(( $(date +%s) - start )) s, logs in $LOGDIR"
exit $status
