#!/bin/bash
# Half tail tiles in the Gluon ragged-M kernel: every Gluon ragged-M GPU test with them on, gpt-oss-like's ragged-M
# products on balanced and routed sizes with and without them, then the layer A/B (eager) with them on.
export PYTHONPATH=$PWD/src RAGDOT_CACHE_DIR=/tmp/rc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/c
timeout 60 python3 -c "
import sys, pytest, ragdot.kernels.gluon.ragged_m as m
m.HALF_TAIL_TILES = True
sys.exit(pytest.main(['-m', 'gpu', '-q', '-p', 'no:cacheprovider', 'tests/test_gluon_ragged_m.py', '-k', 'half_tail or matches']))" 2>&1 \
  | tail -3 | tee $OUT/c/tests.txt
timeout 90 python3 benchmarks/tail_tiles.py --layers gpt-oss-like --tokens 8192 --half --no-triton \
  --gluon-tiles 128x256x32s6w8g8r24 128x256x64s3w8g8r24 \
  --problems up down dgrad_up dgrad_down --rounds 3 --reps 12 --out $OUT/c/tail.json 2>&1 | grep -v Warn \
  > $OUT/c/tail.txt; grep -E 'vendor|gluon' $OUT/c/tail.txt | sed -E 's/^gpt-oss-like +T=8192 +//; s/ ms .*//; s/  +/ /g'
timeout 130 python3 benchmarks/layer_ab.py --set "ragdot.kernels.gluon.ragged_m.HALF_TAIL_TILES=True" \
  --configs gpt-oss-like --tokens 8192 --rounds 2 --peer 2>&1 | tee $OUT/c/ab.txt | tail -12
