#!/usr/bin/env bash
# MoE train step on the H200 for every seed config at this commit (the layer profile now starts from unset
# gradients, as a train step does), plus the 16384-token runs of the configs whose 4096-token steps are
# dominated by the optimizer step.
# Usage (repository root, GPU machine): OUT=/some/dir bash benchmarks/h200_final4.sh
source "$(dirname "$0")/device_common.sh"
log "moe-bench, every config"
timeout 330 python3 -m ragdot moe-bench --max-seconds 3 --out "$R/moe" > "$R/moe.txt" 2>&1
for spec in llama4-17b-16e:16 deepseek2-16b:32 deepseek3-671b-reduced:32; do
  name=${spec%%:*}; batch=${spec##*:}
  log "moe-bench $name at batch $batch"
  timeout 80 python3 -m ragdot moe-bench --configs "$name" --batch "$batch" --max-seconds 2 \
    --out "$R/moe-16k-$name" > "$R/moe-16k-$name.txt" 2>&1
done
finish
