"""Where the host time of ragdot's eager triton calls goes, per class and for fwd+bwd (deepseek3-test dims)."""
import cProfile, io, pstats, statistics, sys, time
import torch, ragdot
from ragdot.kernels import launch as L
from ragdot.measure.classes import CLASSES
M, K, N, E = 5120, 512, 512, 256
dev = torch.device("cuda")
sizes = torch.full((E,), M // E, dtype=torch.int32, device=dev)
seen = {}
orig = L.BoundLaunch.__call__
def spy(self, *args):
    out = orig(self, *args)
    ent = next(iter(self._compiled.values()), None)
    seen.setdefault(self.kernel.__name__, (ent is not None and ent[1] is not None, ent is not None and ent[2] is not None,
                                          [type(a).__name__ for a in args][:8]))
    return out
def host_us(f, n=600):
    for _ in range(20): f()
    torch.cuda.synchronize()
    res = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): f()
        res.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(res)
def prof(f, n=400, top=14):
    pr = cProfile.Profile(); pr.enable()
    for _ in range(n): f()
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(top); print(s.getvalue()[-4000:])
for c in CLASSES:
    d = {"M": M, "K": K, "N": N, "E": E}
    a = torch.randn(*[d[x] for x in c.lhs], dtype=torch.bfloat16, device=dev)
    b = torch.randn(*[d[x] for x in c.rhs], dtype=torch.bfloat16, device=dev)
    dn = c.ragdot_dimension_numbers()
    f = lambda: ragdot.ragged_dot_general(a, b, sizes, dn, backend="triton")
    print(f"== {c.name}: host {host_us(f):.1f} us/call")
    L.BoundLaunch.__call__ = spy; seen.clear(); f(); L.BoundLaunch.__call__ = orig
    print("   launches (kernel, raw bound, descs bound, arg types):", seen)
    if c.name in ("fwd_wi", "dgrad_wo", "wgrad_wi"):
        prof(f)
x = torch.randn(M, K, dtype=torch.bfloat16, device=dev, requires_grad=True)
w = torch.randn(E, K, N, dtype=torch.bfloat16, device=dev, requires_grad=True)
dy = torch.randn(M, N, dtype=torch.bfloat16, device=dev)
def fb(backend):
    return lambda: torch.autograd.backward(ragdot.ragged_dot(x, w, sizes, backend=backend), dy)
def raw():
    offs = torch.cumsum(sizes, 0, dtype=torch.int32)
    torch.autograd.backward(torch._grouped_mm(x, w, offs=offs), dy)
for name, f in (("raw", raw), ("triton", fb("triton")), ("auto", fb(None))):
    print(f"== fwdbwd {name}: host {host_us(f, 300):.1f} us/call")
prof(fb("triton"), 300, 30)
