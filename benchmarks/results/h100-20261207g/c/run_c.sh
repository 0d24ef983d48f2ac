#!/bin/bash
# Every weight-gradient candidate of gpt-oss-like's two products on balanced, skewed and routed sizes; then the
# data gradient of w_gate_up likewise if time is left.
export PYTHONPATH=$PWD/src RAGDOT_CACHE_DIR=/tmp/rc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/c
timeout 330 python3 -m ragdot tune --shapes 32768,2880,5760,128 32768,2880,2880,128 --classes wgrad_wi \
  --routings balanced skewed routed --out $OUT/c 2>&1 | tail -12
timeout 150 python3 -m ragdot tune --shapes 32768,2880,5760,128 --classes dgrad_wi \
  --routings balanced skewed routed --out $OUT/c 2>&1 | tail -8
