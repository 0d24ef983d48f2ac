#!/usr/bin/env bash
# One GPU session of ragdot's checks and benchmarks, in named stages run in the order given:
#   tests   the whole test suite on the GPU (CUDA tensors, bf16 kernels), stopping at the first failure
#   checks  benchmarks/gpu_checks.sh: the gpu-marked tests and compute-sanitizer memcheck
#   host    ragdot host-bench: host time per call against raw torch._grouped_mm (anchor shapes, bf16)
#   bench   ragdot bench --anchors: eager and graph clocks, vendor baseline, balanced routing
#   layer   ragdot moe-bench --layer: one MoE layer fwd+bwd against the plain-PyTorch peer
#   step    ragdot moe-bench --eager: train steps, eager clock
# Usage: OUT=dir bash benchmarks/gpu_session.sh tests host ...   (STAGE_SECONDS bounds each stage; default 300)
# Results and logs go to $OUT (flat files: the device tool brings back a few files, two folders deep).
set -u
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ragdot-session}
mkdir -p "$OUT"
LOG="$OUT/session-log.txt"
log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
limit=${STAGE_SECONDS:-300}
log "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>&1 | head -1)"
log "$(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1)"
for stage in "$@"; do
  log "stage $stage"
  case "$stage" in
    tests) timeout "$limit" python3 -m pytest -q -x -p no:cacheprovider tests > "$OUT/tests.txt" 2>&1
           tail -n 15 "$OUT/tests.txt" | tee -a "$LOG" ;;
    checks) OUT="$OUT" TEST_SECONDS=$limit bash benchmarks/gpu_checks.sh >> "$LOG" 2>&1 ;;
    host) timeout "$limit" python3 -m ragdot.cli host-bench --out "$OUT" 2>&1 | tail -n 60 | tee -a "$LOG" ;;
    bench) timeout "$limit" python3 -m ragdot.cli bench --anchors --out "$OUT" 2>&1 | tail -n 80 | tee -a "$LOG" ;;
    layer) timeout "$limit" python3 -m ragdot.cli moe-bench --layer --configs qwen3-30b-a3b deepseek2-16b \
             --out "$OUT" 2>&1 | tail -n 40 | tee -a "$LOG" ;;
    step) timeout "$limit" python3 -m ragdot.cli moe-bench --eager --out "$OUT" 2>&1 | tail -n 40 | tee -a "$LOG" ;;
    *) log "unknown stage $stage" ;;
  esac
  log "stage $stage rc=${PIPESTATUS[0]}"
done
log "done"
