#!/usr/bin/env bash
# Kernel investigation on the H200: weight-gradient and ragged-M config sweeps (CUDA-graph timing), Nsight
# Compute on the weight gradient, and the padded/XLA baselines still owed by the bench results.
# Usage (repository root, GPU machine): OUT=/some/dir COMMIT=<sha> bash benchmarks/h200_dev3.sh
export RAGDOT_CACHE_DIR=/tmp/ragdot-cache
source "$(dirname "$0")/device_common.sh"
log "start $(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader)"
log "wgrad sweep"
timeout 200 python3 benchmarks/triton_dev.py --out "$R/wgrad" --sweep --graph --routing balanced \
  --classes wgrad_wi,wgrad_wo > "$R/wgrad.txt" 2>&1
log "ragged-M sweep"
timeout 140 python3 benchmarks/triton_dev.py --out "$R/rm" --sweep --graph --routing balanced \
  --shapes qwen3-235b-a22b,mixtral-8x7b,gpt-oss-120b-like --classes fwd_wi,fwd_wo,dgrad_wi,dgrad_wo > "$R/rm.txt" 2>&1
log "ncu"
NCU="ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis"
timeout 60 $NCU python3 benchmarks/profile_cell.py --shape qwen3-30b-a3b --cls wgrad_wi --configs heuristic \
  "64x128x32 g8 w4 s3 tma" "128x128x32 g8 w4 s3 p2 tma" > "$R/ncu-qwen3-30b.txt" 2>&1
timeout 60 $NCU python3 benchmarks/profile_cell.py --shape mixtral-8x7b --cls wgrad_wi --configs heuristic \
  > "$R/ncu-mixtral.txt" 2>&1
log "baselines: gpt-oss-120b-like and mixtral-8x7b, padded/torch/xla"
timeout 150 python3 -m ragdot bench --shapes gpt-oss-120b-like mixtral-8x7b --backends padded torch xla --cuda-graphs \
  --max-seconds 0.3 --no-plots --commit "$COMMIT" --out "$R/baselines" > "$R/baselines.txt" 2>&1
finish
