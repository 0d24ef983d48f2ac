#!/usr/bin/env bash
# Second H200 run: tuning with device-time (graph) measurement, then the torch/triton/auto columns of the
# micro-benchmark for balanced, skewed and empty-expert routing, and the padded/xla baseline for the shape
# the first run did not reach. Usage: OUT=/some/dir COMMIT=<sha> bash benchmarks/h200_rerun.sh
export RAGDOT_CACHE_DIR=/tmp/ragdot-cache
source "$(dirname "$0")/device_common.sh"
log "tune anchors (graph timing)"
timeout 65 python3 -m ragdot tune --shapes anchor --max-configs 3 --warmup 2 --iters 6 > "$R/tune.txt" 2>&1
tail -3 "$R/tune.txt" | tee -a "$R/log.txt"
cp "$RAGDOT_CACHE_DIR/tune.json" "$R/nvidia-h200.json" 2>/dev/null
log "bench torch/triton/auto, balanced + skewed + empty"
timeout 90 python3 -m ragdot bench --anchors --routing balanced skewed empty --backends torch triton auto --no-xla \
  --cuda-graphs --max-seconds 0.1 --rounds 3 --no-plots --commit "$COMMIT" --out "$R/bench_tta" > "$R/bench_tta.txt" 2>&1
tail -45 "$R/bench_tta.txt" >> "$R/log.txt"
log "bench gpt-oss baselines"
timeout 25 python3 -m ragdot bench --shapes gpt-oss-120b-like --routing balanced --backends padded torch xla \
  --cuda-graphs --max-seconds 0.3 --no-plots --commit "$COMMIT" --out "$R/bench_gptoss" > "$R/bench_gptoss.txt" 2>&1
tail -12 "$R/bench_gptoss.txt" >> "$R/log.txt"
finish
