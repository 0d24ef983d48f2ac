#!/usr/bin/env bash
# The GPU checks of ragdot's reliability contract, for a GPU machine:
#   1. the gpu-marked tests (python3 -m pytest -q -m gpu tests);
#   2. compute-sanitizer --tool memcheck on a fixed set of triton calls (benchmarks/memcheck_calls.py: skewed
#      sizes, empty groups, NaN tails with sum < M, G=1, M below a tile, the three problems and their
#      backward), with PyTorch's caching allocator off so that an access past a tensor's end leaves its
#      allocation.
# Prints each step's summary (pytest's last lines, the checks that failed, the sanitizer's ERROR SUMMARY) and
# exits 1 when any step fails. Logs go to $OUT when it is set (else /tmp/ragdot-gpu-checks): gpu-checks-log.txt,
# gpu-tests.txt, memcheck.txt.
# Usage (any directory): [OUT=/some/dir] [TEST_SECONDS=420] [MEMCHECK_SECONDS=240] bash benchmarks/gpu_checks.sh
set -u
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=src PYTHONUNBUFFERED=1
L=${OUT:-/tmp/ragdot-gpu-checks}
mkdir -p "$L"
LOG="$L/gpu-checks-log.txt"
status=0
log() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)"
log "$(python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tail -1)"
log "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

log "gpu tests"
timeout "${TEST_SECONDS:-420}" python3 -m pytest -q -p no:cacheprovider -m gpu tests > "$L/gpu-tests.txt" 2>&1
rc=$?
tail -n 3 "$L/gpu-tests.txt" | tee -a "$LOG"
log "gpu tests rc=$rc (0 passed; 124 timed out)"
[ "$rc" -eq 0 ] || status=1

log "memcheck on the triton calls"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -z "$sanitizer" ]; then
  log "compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"
  status=1
else
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${MEMCHECK_SECONDS:-240}" "$sanitizer" --tool memcheck \
    --error-exitcode 3 --print-limit 50 python3 benchmarks/memcheck_calls.py > "$L/memcheck.txt" 2>&1
  rc=$?
  grep -E -A3 "^FAIL" "$L/memcheck.txt" | tee -a "$LOG"
  grep -E "memcheck calls:|memcheck_calls:|ERROR SUMMARY" "$L/memcheck.txt" | tee -a "$LOG"
  log "memcheck rc=$rc (0 clean; 3 the sanitizer found errors; 1 a check failed; 124 timed out)"
  [ "$rc" -eq 0 ] || status=1
fi
log "done: $([ "$status" -eq 0 ] && echo 'all checks passed' || echo 'FAILED')"
exit "$status"
