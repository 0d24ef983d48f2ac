#!/usr/bin/env bash
# The measured results of this commit on the H200, part 2 (one 10-minute device call): memory bandwidth
# ceilings (write-only for the weight gradient's output), a weight-gradient tile-order check, and the MoE
# train step for the seed configs not measured before.
# Usage (repository root, GPU machine): OUT=/some/dir COMMIT=<sha> bash benchmarks/h200_final2.sh
source "$(dirname "$0")/device_common.sh"
log "bandwidth"
timeout 60 python3 benchmarks/bandwidth_probe.py 2>&1 | tee -a "$R/log.txt"
log "wgrad sweep, three store-bound shapes"
timeout 90 python3 benchmarks/triton_dev.py --out "$R/wgrad" --sweep --graph --routing balanced \
  --shapes qwen3-30b-a3b,gemma4-26b,gpt-oss-120b-like --classes wgrad_wi > "$R/wgrad.txt" 2>&1
log "moe-bench, remaining configs"
timeout 400 python3 -m ragdot moe-bench --configs qwen3-235b-a22b gemma4-26b deepseek2-16b llama4-17b-16e \
  mixtral-8x7b deepseek3-671b-reduced --max-seconds 3 --out "$R/moe" > "$R/moe.txt" 2>&1
finish
