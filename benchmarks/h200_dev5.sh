#!/usr/bin/env bash
# Split-tail ragged-M tiles on the H200: GPU kernel tests, then sweeps (CUDA-graph timing) of the ragged-M
# cells of qwen3-235b (160 rows per group: 128 + 64-row tiles instead of 2 x 128) on balanced and skewed
# routing, and of gpt-oss-120b-like / mixtral-8x7b on skewed routing.
# Usage (repository root, GPU machine): OUT=/some/dir bash benchmarks/h200_dev5.sh
source "$(dirname "$0")/device_common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv \
  | tee -a "$R/log.txt"
log "gpu kernel tests"
timeout 200 python3 -m pytest -q -m gpu tests/test_triton_kernels.py > "$R/gpu-tests.txt" 2>&1
tail -3 "$R/gpu-tests.txt" | tee -a "$R/log.txt"
log "qwen3-235b ragged-M sweep, balanced + skewed"
timeout 240 python3 benchmarks/triton_dev.py --out "$R/q235" --sweep --graph --reps 15 --routing balanced,skewed \
  --sweep-routing balanced,skewed --shapes qwen3-235b-a22b --classes fwd_wi,fwd_wo,dgrad_wi,dgrad_wo \
  > "$R/q235.txt" 2>&1
log "gpt-oss / mixtral ragged-M sweep, skewed"
timeout 200 python3 benchmarks/triton_dev.py --out "$R/skew" --sweep --graph --reps 9 --routing skewed \
  --sweep-routing skewed --shapes gpt-oss-120b-like,mixtral-8x7b --classes fwd_wi,dgrad_wo > "$R/skew.txt" 2>&1
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv \
  | tee -a "$R/log.txt"
finish
