#!/usr/bin/env bash
# Config sweeps on the H200 (CUDA-graph timing below 2 ms per call): every weight-gradient cell, and the
# ragged-M cells of the shapes h200_dev3.sh did not sweep.
# Usage (repository root, GPU machine): OUT=/some/dir bash benchmarks/h200_dev4.sh
source "$(dirname "$0")/device_common.sh"
log "wgrad sweep"
timeout 260 python3 benchmarks/triton_dev.py --out "$R/wgrad" --sweep --graph --routing balanced \
  --classes wgrad_wi,wgrad_wo > "$R/wgrad.txt" 2>&1
log "ragged-M sweep"
timeout 200 python3 benchmarks/triton_dev.py --out "$R/rm" --sweep --graph --routing balanced \
  --shapes deepseek2-16b,deepseek3-test,gemma4-26b,qwen3-30b-a3b,llama4-17b-16e \
  --classes fwd_wi,fwd_wo,dgrad_wi,dgrad_wo > "$R/rm.txt" 2>&1
finish
