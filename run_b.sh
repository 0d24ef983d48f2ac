#!/bin/bash
# The size-pattern probe again (its first run freed each pattern's sizes before the replays), and the second
# tune file of run_a (w_down's forward and data gradient on three routings), whose file did not come back.
export PYTHONPATH=$PWD/src RAGDOT_CACHE_DIR=/tmp/rc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/b
timeout 200 python3 benchmarks/wgrad_sizes.py --shapes 32768,2880,5760,128 32768,2880,2880,128 --rounds 4 \
  --out $OUT/b/sizes.json 2>&1 | grep -v Warn | tee $OUT/b/sizes.txt
timeout 150 python3 -m ragdot tune --shapes 32768,2880,2880,128 --classes fwd_wo dgrad_wo --max-configs 6 \
  --routings balanced skewed routed --out $OUT/b 2>&1 | tail -5
rm -f $OUT/b/.*.lock
