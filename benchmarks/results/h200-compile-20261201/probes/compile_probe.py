"""Where a transformers train step's device time goes, by kernel name (CUPTI through torch.profiler), per
experts implementation and mode: eager or torch.compile (inductor). H200, bf16, the bench-models widths.

    PYTHONPATH=src python3 probes/compile_probe.py qwen3-moe,deepseek-v3 grouped_mm:compile,ragdot:compile,ragdot:eager
"""
import collections, statistics, sys, time
import torch
import ragdot.integrations.transformers as rt
from ragdot.bench.models import MODELS, build_model, _ids
from ragdot.measure.timing import timed_call
from torch.profiler import ProfilerActivity, profile

rt.register()
rt.register(rt.FUSED_NAME, fused=True)
dev = torch.device("cuda")
models = sys.argv[1].split(",")
combos = [c.split(":") for c in sys.argv[2].split(",")]  # impl:mode
for mname in models:
    spec = MODELS[mname]
    model = build_model(spec, dev, torch.bfloat16)
    ids = _ids(spec, spec.train_batch, spec.seq_len, dev)
    for impl, mode in combos:
        torch._dynamo.reset()
        model.set_experts_implementation(impl)
        run = torch.compile(model) if mode == "compile" else model
        def step():
            model.zero_grad(set_to_none=True)
            run(ids, labels=ids).loss.backward()
        t0 = time.time()
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        ms = statistics.median(timed_call(step, dev)[0] for _ in range(5))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step(); torch.cuda.synchronize()
        tot, cnt = collections.Counter(), collections.Counter()
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                tot[e.name] += e.device_time_total / 1e3  # ms
                cnt[e.name] += 1
        print(f"== {mname} {impl} {mode}: step {ms:.2f} ms, kernels {sum(tot.values()):.2f} ms ({len(cnt)} names, {sum(cnt.values())} launches), warm {time.time()-t0:.0f} s", flush=True)
        for name, t in tot.most_common(22):
            print(f"   {t:8.3f} ms {cnt[name]:5d}x  {name[:150]}")
    del model
    torch.cuda.empty_cache()
