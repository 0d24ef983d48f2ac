#!/usr/bin/env bash
# The measured results of this commit on the H200, part 1 (one 10-minute device call): GPU tests of the
# kernels in bf16, compute-sanitizer on small cases, the anchor-shape tune (20 replays per candidate), and
# the torch/triton/auto benchmark over balanced, skewed and empty routing with the fresh tune cache.
# Usage (repository root, GPU machine): OUT=/some/dir COMMIT=<sha> bash benchmarks/h200_final.sh
export RAGDOT_CACHE_DIR=/tmp/ragdot-cache
source "$(dirname "$0")/device_common.sh"
log "gpu tests"
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_kernels.py \
  "tests/test_backends.py" "tests/test_autograd.py" -k "bfloat16 or gpu or cuda or sm90" > "$R/gpu-tests.txt" 2>&1
tail -2 "$R/gpu-tests.txt" | tee -a "$R/log.txt"
log "memcheck"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 python3 benchmarks/triton_dev.py --small-cases \
  > "$R/memcheck.txt" 2>&1; echo "memcheck rc=$?" | tee -a "$R/log.txt"
log "tune anchors, 20 replays per candidate"
timeout 260 python3 -m ragdot tune --shapes anchor --max-configs 7 --warmup 3 --iters 20 > "$R/tune.txt" 2>&1
cp "$RAGDOT_CACHE_DIR/tune.json" "$R/nvidia-h200.json" 2>/dev/null
log "bench torch/triton/auto, balanced + skewed + empty"
timeout 140 python3 -m ragdot bench --anchors --routing balanced skewed empty --backends torch triton auto --no-xla \
  --cuda-graphs --max-seconds 0.15 --no-plots --commit "$COMMIT" --out "$R/tta" > "$R/tta.txt" 2>&1
finish
