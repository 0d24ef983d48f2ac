#!/bin/bash
# The gathering Gluon weight gradient with ping-pong consumers: GPU tests, the probe, the layer A/B.
export PYTHONPATH=$PWD/src RAGDOT_CACHE_DIR=/tmp/rc
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/b
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_gather.py tests/test_fused_moe.py \
  -k "gather or every_way" 2>&1 | tail -4 | tee $OUT/b/tests.txt
for t in 128,128,64,4 64,256,64,4; do
  timeout 80 python3 benchmarks/gluon_gather_probe.py --tile $t --consumers 2 --stages 4 5 2>&1 | grep -v Warn
done | tee $OUT/b/probe.txt
timeout 240 python3 benchmarks/layer_ab.py --set-a "ragdot.moe.fused.wgrad_rows='chunks'" \
  --set "ragdot.moe.fused.wgrad_rows='gather'" --configs gpt-oss-like qwen3-30b-a3b deepseek2-16b \
  deepseek3-671b-reduced --tokens 8192 --rounds 3 --peer 2>&1 | tee $OUT/b/ab.txt | tail -30
timeout 100 python3 -c "
import sys, ragdot.moe.fused as f
f.wgrad_rows = 'gather'
from ragdot.cli import main
sys.exit(main(['moe-bench', '--layer', '--modes', 'eager', '--tokens', '8192', '32768', '--configs', 'gpt-oss-like',
               '--variants', 'peer', 'sparse-auto', '--no-plots', '--out', '$OUT/b/layer']))" 2>&1 | tail -12 | tee $OUT/b/layer.txt
