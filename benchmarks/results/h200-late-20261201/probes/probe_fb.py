"""Where the fwd+bwd host time goes: per-position host time inside a chunk of 16 calls (does it grow as the
queue fills?), the same with autograd's device threads off, and forward vs backward host time."""
import statistics, time, json
import torch
from ragdot.bench.host import make_operands, make_call, _forward
from ragdot.shapes import get_shape

dev = torch.device("cuda")
sync = torch.cuda.synchronize
pc = time.perf_counter

def positions(call, chunk=16, rounds=25):
    per = [[] for _ in range(chunk)]
    for _ in range(3):
        call()
    for _ in range(rounds):
        sync()
        t0 = pc()
        for i in range(chunk):
            call()
            t1 = pc()
            per[i].append((t1 - t0) * 1e6)
            t0 = t1
    return [round(statistics.median(p), 1) for p in per]

for name in ("qwen3-30b-a3b", "deepseek3-test"):
    o = make_operands(get_shape(name), torch.bfloat16, dev, "balanced", 0)
    for system in ("raw+cumsum", "ragdot-triton", "ragdot-torch"):
        step = make_call(system, "fwdbwd", o)
        step()
        res = {"mt": positions(step)}
        with torch.autograd.set_multithreading_enabled(False):
            res["single-thread"] = positions(step)
        fwd = _forward(system, o)
        x, w, dy = o.x_leaf, o.w_leaf, o.dy
        f_t, b_t = [], []
        for r in range(60):
            x.grad = w.grad = None
            if r % 8 == 0:
                sync()
            t0 = pc(); y = fwd(x, w); t1 = pc(); y.backward(dy); t2 = pc()
            f_t.append((t1 - t0) * 1e6); b_t.append((t2 - t1) * 1e6)
        res["fwd_us"] = round(statistics.median(f_t), 1)
        res["bwd_us"] = round(statistics.median(b_t), 1)
        print(name, system, json.dumps(res), flush=True)
