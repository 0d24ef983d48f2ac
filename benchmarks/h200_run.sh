#!/usr/bin/env bash
# The first H200 run of 2026-11-29: bf16 GPU tests, tuning of the anchor shapes, the micro-benchmark (balanced with every
# backend and XLA, skewed and empty-expert routing for torch/triton/auto), and the MoE train-step benchmark.
# Usage (repository root, GPU machine): OUT=/some/dir COMMIT=<sha> bash benchmarks/h200_run.sh
export RAGDOT_CACHE_DIR=/tmp/ragdot-cache
source "$(dirname "$0")/device_common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv >> "$R/log.txt"
log "gpu tests (bf16 suite + gpu-marked)"
timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_backends.py tests/test_autograd.py -k bfloat16 2>&1 | tail -4 | tee -a "$R/log.txt"
timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tail -4 | tee -a "$R/log.txt"
log "tune anchors"
timeout 130 python3 -m ragdot tune --shapes anchor --max-configs 3 --warmup 3 --iters 10 > "$R/tune.txt" 2>&1
tail -5 "$R/tune.txt" | tee -a "$R/log.txt"
cp "$RAGDOT_CACHE_DIR/tune.json" "$R/nvidia-h200.json" 2>/dev/null
log "bench balanced, all backends + xla (CUDA graphs)"
timeout 210 python3 -m ragdot bench --anchors --routing balanced --cuda-graphs --max-seconds 0.3 \
  --commit "$COMMIT" --out "$R/bench_balanced" > "$R/bench_balanced.txt" 2>&1
tail -30 "$R/bench_balanced.txt" >> "$R/log.txt"
log "bench skewed + empty, torch/triton/auto"
timeout 70 python3 -m ragdot bench --anchors --routing skewed empty --backends torch triton auto --no-xla \
  --cuda-graphs --max-seconds 0.2 --commit "$COMMIT" --out "$R/bench_skewed" > "$R/bench_skewed.txt" 2>&1
tail -30 "$R/bench_skewed.txt" >> "$R/log.txt"
log "moe-bench"
timeout "${MOE_SECONDS:-60}" python3 -m ragdot moe-bench --configs qwen3-30b-a3b deepseek3-test --max-seconds 3 \
  --out "$R/moe" > "$R/moe.txt" 2>&1
tail -30 "$R/moe.txt" >> "$R/log.txt"
finish
