#!/usr/bin/env bash
# The runs still owed on the H200 (see docs/benchmarks.md), sized for one 10-minute device call:
# the padded/XLA baselines the first run did not reach, a re-tune with more replays per candidate followed
# by the torch/triton/auto benchmark, and the MoE train step for the remaining seed configs.
# Usage (repository root, GPU machine): OUT=/some/dir COMMIT=<sha> bash benchmarks/h200_next.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 RAGDOT_CACHE_DIR=/tmp/ragdot-cache
R=/tmp/ragdot-results
mkdir -p "$R" "$RAGDOT_CACHE_DIR"
log() { echo "== $(date +%T) $*" | tee -a "$R/log.txt"; }
log "baselines: gpt-oss-120b-like and mixtral-8x7b, padded/torch/xla"
timeout 120 python3 -m ragdot bench --shapes gpt-oss-120b-like mixtral-8x7b --backends padded torch xla \
  --cuda-graphs --max-seconds 0.3 --no-plots --commit "$COMMIT" --out "$R/baselines" > "$R/baselines.txt" 2>&1
log "tune anchors, 30 replays per candidate"
timeout 150 python3 -m ragdot tune --shapes anchor --max-configs 4 --warmup 3 --iters 30 > "$R/tune.txt" 2>&1
cp "$RAGDOT_CACHE_DIR/tune.json" "$R/nvidia-h200.json" 2>/dev/null
log "bench torch/triton/auto, balanced + skewed + empty"
timeout 110 python3 -m ragdot bench --anchors --routing balanced skewed empty --backends torch triton auto --no-xla \
  --cuda-graphs --max-seconds 0.15 --no-plots --commit "$COMMIT" --out "$R/tta" > "$R/tta.txt" 2>&1
log "moe-bench, remaining configs"
timeout 170 python3 -m ragdot moe-bench --configs qwen3-235b-a22b gemma4-26b deepseek2-16b llama4-17b-16e \
  mixtral-8x7b deepseek3-671b-reduced --max-seconds 3 --out "$R/moe" > "$R/moe.txt" 2>&1
log "done"
tar czf "$OUT/results.tgz" -C "$R" .
cp "$R/log.txt" "$OUT/log.txt"
