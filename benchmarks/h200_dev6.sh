#!/usr/bin/env bash
# Flat persistent ragged-M kernel on the H200: GPU kernel tests, then CUDA-graph sweeps of every anchor
# shape's ragged-M cells (balanced) and qwen3-235b's (skewed), flat and unflattened configs side by side.
# Usage (repository root, GPU machine): OUT=/some/dir bash benchmarks/h200_dev6.sh
source "$(dirname "$0")/device_common.sh"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv | tee -a "$R/log.txt"
log "gpu kernel tests"
timeout 200 python3 -m pytest -q -m gpu tests/test_triton_kernels.py > "$R/gpu-tests.txt" 2>&1
tail -3 "$R/gpu-tests.txt" | tee -a "$R/log.txt"
log "ragged-M sweep, balanced, all anchors"
timeout 330 python3 benchmarks/triton_dev.py --out "$R/rm" --sweep --graph --reps 9 --routing balanced \
  --classes fwd_wi,fwd_wo,dgrad_wi,dgrad_wo > "$R/rm.txt" 2>&1
log "qwen3-235b ragged-M sweep, skewed"
timeout 100 python3 benchmarks/triton_dev.py --out "$R/q235s" --sweep --graph --reps 9 --routing skewed \
  --sweep-routing skewed --shapes qwen3-235b-a22b --classes fwd_wi,fwd_wo,dgrad_wi,dgrad_wo > "$R/q235s.txt" 2>&1
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv \
  | tee -a "$R/log.txt"
finish
