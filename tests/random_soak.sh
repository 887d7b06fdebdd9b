#!/usr/bin/env bash
# The random-program test at scale: N shards of tests/test_random_programs.py side by side, each
# drawing PROGRAMS/N programs from its own hypothesis seed (shard i: seed i), spread over $GPUS
# GPUs in turn. A shard stops at its first wrong answer or crash and shrinks it.
#   tests/random_soak.sh PROGRAMS [N]      (N = 16 by default; logs under $LOGDIR)
# Prints each shard's last line and how many programs came out right, fused or not; exits non-zero
# when any shard fails (a wrong answer, a crash, or its time limit).
set -uo pipefail
cd "$(dirname "$0")/.."
PROGRAMS=${1:?programs}
N=${2:-16}
LOGDIR=${LOGDIR:-/tmp/fxflash_random_soak}
LIMIT=${LIMIT:-1800}
GPUS=${GPUS:-1}
PY=${PYTHON:-python}
mkdir -p "$LOGDIR"
export FXFLASH_AUTOTUNE=${FXFLASH_AUTOTUNE:-0} FXFLASH_LONG=1 FXFLASH_EXAMPLES=$(( (PROGRAMS + N - 1) / N ))
shard() {
  timeout "$LIMIT" "$PY" -m pytest tests/test_random_programs.py -k "matches_eager or most_drawn" \
    --hypothesis-seed="$1" -q -s -p no:cacheprovider -rfE
}
source tests/shards.sh
start=$(date +%s)
run_shards "$N"
fused=$(cat "$LOGDIR"/shard_*.log | grep -o "program fused right" | wc -l)
eager=$(cat "$LOGDIR"/shard_*.log | grep -o "program eager right" | wc -l)
echo "$((fused + eager)) programs right ($fused with a fused region, $eager without)"
echo "$N shards, $FXFLASH_EXAMPLES programs each, in $(( $(date +%s) - start )) s, logs in $LOGDIR"
exit $status
