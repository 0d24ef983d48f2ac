#!/usr/bin/env bash
# Verification on the H200 with only the shipped tune file (an empty user cache): every anchor cell finds its
# entry in a fresh process, then torch/triton/auto on balanced, skewed and empty routing (auto's choice is in
# each row's note), and the balanced bench once more in a new process.
# Usage (repository root, GPU machine): OUT=/some/dir COMMIT=<sha> bash benchmarks/h200_verify.sh
export RAGDOT_CACHE_DIR=/tmp/ragdot-empty-cache
source "$(dirname "$0")/device_common.sh"
log "shipped entries"
timeout 60 python3 benchmarks/check_shipped_tune.py > "$R/shipped.txt" 2>&1; echo "rc=$?" >> "$R/shipped.txt"
tail -2 "$R/shipped.txt" | tee -a "$R/log.txt"
log "bench torch/triton/auto, balanced + skewed + empty"
timeout 150 python3 -m ragdot bench --anchors --routing balanced skewed empty --backends torch triton auto --no-xla \
  --cuda-graphs --max-seconds 0.15 --no-plots --commit "$COMMIT" --out "$R/tta" > "$R/tta.txt" 2>&1
log "bench again in a new process, balanced"
timeout 100 python3 -m ragdot bench --anchors --routing balanced --backends torch triton auto --no-xla \
  --cuda-graphs --max-seconds 0.15 --no-plots --commit "$COMMIT" --out "$R/tta2" > "$R/tta2.txt" 2>&1
finish
