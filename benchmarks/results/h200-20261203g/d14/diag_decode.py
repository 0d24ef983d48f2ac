"""gpt-oss-like compiled decode b1 with ragdot: step times, the runners chosen, a CPU+CUDA profile.
argv: old (the 64x128x64 tile for <= 64 rows) | new"""
import sys, time, torch
import ragdot.kernels.configs as cfgs
from ragdot.kernels.configs import TileConfig
if sys.argv[1] == "old":
    orig = cfgs._ragged_m_config
    def patched(m, k, n, g, wide):
        if m / max(g, 1) <= 64:
            return TileConfig(64, 128, 64, group_m=1, num_warps=4, num_stages=4)
        return orig(m, k, n, g, wide)
    cfgs._ragged_m_config = patched
from ragdot import ops
from ragdot.bench.models import MODELS, _ids, build_model, _cache_of
import ragdot.integrations.transformers as rt
rt.register()
dev = torch.device("cuda")
spec = MODELS["gpt-oss"]
torch.manual_seed(0)
model = build_model(spec, dev, torch.bfloat16).eval()
batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
prompt = _ids(spec, batch, spec.prefill_len, dev)
for impl in ("ragdot", "grouped_mm"):
    model.set_experts_implementation(impl)
    torch._dynamo.reset()
    run = torch.compile(model)
    with torch.no_grad():
        out = model(prompt, use_cache=True, logits_to_keep=1)
        cache, nxt = _cache_of(out), out.logits[:, -1:].argmax(-1)
        for i in range(8):
            o = run(nxt, use_cache=True, past_key_values=cache)
            cache, nxt = _cache_of(o), o.logits[:, -1:].argmax(-1)
        torch.cuda.synchronize()
        ts = []
        for i in range(20):
            t0 = time.perf_counter()
            o = run(nxt, use_cache=True, past_key_values=cache)
            cache, nxt = _cache_of(o), o.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts.sort()
        print(f"{sys.argv[1]} {impl} b{batch}: step ms (sync each) median {ts[10]:.3f} min {ts[0]:.3f} max {ts[-1]:.3f}")
        if impl == "ragdot":
            for key, r in ops._RUNNERS.items():
                print("  runner", key[0], key[1], tuple(key[2]), tuple(key[3]), tuple(key[6]), tuple(key[7]), r.label)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
            for i in range(3):
                o = run(nxt, use_cache=True, past_key_values=cache)
                cache, nxt = _cache_of(o), o.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=60))
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60))
