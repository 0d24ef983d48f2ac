"""Host-time breakdown of ragdot's eager forward (torch and triton backends) and fwd+bwd; cProfile tops."""
import cProfile, io, pstats, sys, json
import torch
import ragdot
from ragdot import api
from ragdot.bench.host import make_operands, make_call
from ragdot.measure.host import time_host_interleaved
from ragdot.shapes import get_shape
from ragdot.kernels.ends import GroupEnds
from ragdot.kernels.tail import ZeroTail

dev = torch.device("cuda")
res = {}
for name in sys.argv[1:] or ["deepseek3-test", "qwen3-30b-a3b"]:
    shape = get_shape(name)
    o = make_operands(shape, torch.bfloat16, dev, "balanced", 0)
    x, w, sizes, offs = o.x, o.w, o.group_sizes, o.offs
    for backend in ("torch", "triton"):
        ragdot.ragged_dot(x, w, sizes, backend=backend)
    calls = {k: v for k, v in api._CALLS.items() if k[0] == x.shape}
    ct = [c for c in calls.values() if c.backend == "torch"][0]
    ctr = [c for c in calls.values() if c.backend == "triton"][0]
    fn = ct.runner.fn
    ge = GroupEnds(shape.E, shape.M, 1, dev)
    out = torch._grouped_mm(x, w, offs=offs)
    zt = ZeroTail((1, shape.M, shape.N), shape.E, dev)
    out3 = out.unsqueeze(0)
    mm, cs, i32 = torch._grouped_mm, torch.cumsum, torch.int32
    vs = ct.plan.view_shape
    named = {
        "raw": lambda: mm(x, w, offs=offs),
        "raw+cumsum": lambda: mm(x, w, offs=cs(sizes, 0, dtype=i32)),
        "cumsum": lambda: cs(sizes, 0, dtype=i32),
        "empty": lambda: torch.empty_like(out),
        "ends(triton)": lambda: ge(sizes),
        "tail(triton)": lambda: zt(out3, offs),
        "prepared.direct": lambda: fn.direct(x, w, sizes, None),
        "prepared.direct+ends": lambda: fn.direct(x, w, sizes, None, offs),
        "runner.call_direct": lambda: ct.runner.call_direct(x, w, sizes, vs),
        "_Call.forward": lambda: ct.forward(x, w, sizes),
        "_Call()": lambda: ct(x, w, sizes),
        "ragdot-torch": lambda: ragdot.ragged_dot(x, w, sizes, backend="torch"),
        "triton.call_direct": lambda: ctr.runner.call_direct(x, w, sizes, vs),
        "ragdot-triton": lambda: ragdot.ragged_dot(x, w, sizes, backend="triton"),
    }
    t = time_host_interleaved(named, dev, calls=300, repeats=5, warmup=20, chunk=16, max_seconds=1.0)
    res[name] = {k: round(v.host_us, 2) for k, v in t.items()}
    print(name, json.dumps(res[name], indent=1), flush=True)
    fb = {s: make_call(s, "fwdbwd", o) for s in ("raw+cumsum", "ragdot-torch", "ragdot-triton")}
    t = time_host_interleaved(fb, dev, calls=200, repeats=5, warmup=10, chunk=16, max_seconds=1.0)
    res[name + "/fwdbwd"] = {k: round(v.host_us, 2) for k, v in t.items()}
    print(name, "fwdbwd", res[name + "/fwdbwd"], flush=True)
    for label, f, n in (("ragdot-torch fwd", named["ragdot-torch"], 3000), ("raw fwd", named["raw+cumsum"], 3000),
                        ("ragdot-triton fwdbwd", fb["ragdot-triton"], 600), ("raw fwdbwd", fb["raw+cumsum"], 600)):
        torch.cuda.synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for i in range(n):
            f()
            if i % 16 == 15:
                torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
        print(f"==== cProfile {name} {label} ({n} calls)\n" + s.getvalue()[-6000:], flush=True)
