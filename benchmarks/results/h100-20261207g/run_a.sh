#!/bin/bash
# H200 only: the headline suite on this tree; on any other GPU nothing runs.
export RAGDOT_CACHE_DIR=/tmp/rc
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu"
if [[ "$gpu" == *H200* ]]; then
  timeout 560 python3 benchmarks/suite.py headline --require-gpu H200 --pack --out $OUT/headline
  tail -c 6000 $OUT/headline/suite-log.txt
else
  echo "not an H200: nothing run"
fi
