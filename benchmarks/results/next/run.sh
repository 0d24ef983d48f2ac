#!/bin/bash
export PYTHONPATH=$PWD/src RAGDOT_CACHE_DIR=/tmp/rc
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
echo "GPU: $name"
loopgaps() {
  timeout $1 python3 benchmarks/loop_gaps.py --configs gpt-oss-like qwen3-30b-a3b --variants sparse-auto --steps 6 \
    --out $OUT/loop 2>&1 | grep -v -i warn | tail -60
}
if [[ $name == *H200* ]]; then
  timeout 420 python3 benchmarks/suite.py headline --require-gpu H200 --pack --out $OUT/headline 2>&1 | tail -30
  mkdir -p $OUT/c
  timeout 60 python3 -c "
import sys, pytest, ragdot.kernels.gluon.ragged_m as m
m.HALF_TAIL_TILES = True
sys.exit(pytest.main(['-m', 'gpu', '-q', '-p', 'no:cacheprovider', 'tests/test_gluon_ragged_m.py', '-k', 'half_tail or matches']))" 2>&1 | tail -3 | tee $OUT/c/tests.txt
  loopgaps 100
else
  bash benchmarks/results/h100-20261207h/c/run_c.sh
  loopgaps 150
fi
rm -f $OUT/**/.*.lock $OUT/.*.lock 2>/dev/null
