# Sourced by tests/gpu_suite.sh and tests/random_soak.sh: runs shards side by side.
# run_shards N: runs `shard I` (a function the caller defines) for I in 0..N-1 at once, shard I on GPU
# I % $GPUS with its output in $LOGDIR/shard_I.log; then prints each shard's last line, and sets
# `status` to 1 where any shard exited non-zero (a failure, or its time limit).
run_shards() {
  local n=$1 i rc
  local pids=()
  status=0
  for ((i = 0; i < n; i++)); do
    CUDA_VISIBLE_DEVICES=$((i % GPUS)) shard "$i" > "$LOGDIR/shard_$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    wait "${pids[$i]}"
    rc=$?
    [ $rc -eq 0 ] || { status=1; echo "shard $i/$n FAILED (exit $rc; $LOGDIR/shard_$i.log)"; }
    echo "shard $i/$n: $(tail -n 1 "$LOGDIR/shard_$i.log")"
  done
}
