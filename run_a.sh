#!/bin/bash
# First call: the H200 headline where an H200 came; on an H100 the gpt-oss-like layer against peer on the merged
# tune file, gather against chunks there, and the size-pattern probe of the weight-gradient tiles.
export PYTHONPATH=$PWD/src RAGDOT_CACHE_DIR=/tmp/rc
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/a
if [[ "$gpu" == *H200* ]]; then
  timeout 420 python3 benchmarks/suite.py headline --require-gpu H200 --pack --out $OUT/headline 2>&1 | tail -40
  timeout 150 python3 benchmarks/wgrad_sizes.py --shapes 32768,2880,5760,128 --out $OUT/a/sizes.json 2>&1 \
    | grep -v Warn | tee $OUT/a/sizes.txt
  exit 0
fi
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon.py -k "trimmed or straddle" 2>&1 \
  | tail -3 | tee $OUT/a/tests.txt
timeout 150 python3 benchmarks/wgrad_sizes.py --shapes 32768,2880,5760,128 --rounds 4 \
  --out $OUT/a/sizes.json 2>&1 | grep -v Warn | tee $OUT/a/sizes.txt
timeout 120 python3 -m ragdot moe-bench --layer --modes eager --tokens 8192 32768 --configs gpt-oss-like \
  --variants peer sparse-auto --no-plots --out $OUT/a/layer 2>&1 | tail -14 | tee $OUT/a/layer.txt
# gpt-oss-like's forward and w_down data-gradient products on the three routings (their entries: balanced, skewed)
timeout 110 python3 -m ragdot tune --shapes 32768,2880,5760,128 --classes fwd_wi --max-configs 8 \
  --routings balanced skewed routed --out $OUT/a/tune 2>&1 | tail -5
timeout 100 python3 -m ragdot tune --shapes 32768,2880,2880,128 --classes fwd_wo dgrad_wo --max-configs 6 \
  --routings balanced skewed routed --out $OUT/a/tune 2>&1 | tail -5
