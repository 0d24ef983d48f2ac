#!/usr/bin/env bash
# Warp-specialized ragged-M tiles on the H200: GPU kernel tests, then a CUDA-graph sweep of every anchor
# shape's ragged-M cells (balanced) with the flat persistent and the warp-specialized configs side by side.
# Usage (repository root, GPU machine): OUT=/some/dir bash benchmarks/h200_dev7.sh
source "$(dirname "$0")/device_common.sh"
log "gpu kernel tests"
timeout 120 python3 -m pytest -q -m gpu tests/test_triton_kernels.py > "$R/gpu-tests.txt" 2>&1
tail -3 "$R/gpu-tests.txt" | tee -a "$R/log.txt"
log "ragged-M sweep, balanced, flat vs warp-specialized"
SWEEP_MATCH="flat|ws" timeout 300 python3 benchmarks/triton_dev.py --out "$R/rm" --sweep --graph --reps 9 \
  --routing balanced --classes fwd_wi,fwd_wo,dgrad_wi,dgrad_wo > "$R/rm.txt" 2>&1
finish
