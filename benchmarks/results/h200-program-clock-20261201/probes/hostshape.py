"""Host time of ragdot's eager triton forward per anchor shape, and which launch path each kernel takes."""
import cProfile, io, pstats, statistics, time
import torch, ragdot
from ragdot.kernels import launch as L
from ragdot.shapes import shapes_with_tag
dev = torch.device("cuda")
orig = L.BoundLaunch.__call__
seen = {}
def spy(self, *args):
    out = orig(self, *args)
    ent = next(iter(self._compiled.values()), None)
    seen[self.kernel.__name__] = dict(raw=ent is not None and ent[1] is not None, descs=ent is not None and ent[2] is not None,
                                      grid=self.grid, opts=self.options, n_compiled=len(self._compiled))
    return out
def host_us(f, n):
    for _ in range(3): f()
    torch.cuda.synchronize()
    res = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n): f()
        res.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(res), min(res)
def raw_fn(x, w, s):
    offs = torch.cumsum(s, 0, dtype=torch.int32)
    return torch._grouped_mm(x, w, offs=offs)
for sh in shapes_with_tag("anchor"):
    x = torch.randn(sh.M, sh.K, dtype=torch.bfloat16, device=dev)
    w = torch.randn(sh.E, sh.K, sh.N, dtype=torch.bfloat16, device=dev)
    s = torch.full((sh.E,), sh.M // sh.E, dtype=torch.int32, device=dev)
    n = 20 if sh.M * sh.K * sh.N > 1e11 else 100
    f = lambda: ragdot.ragged_dot(x, w, s, backend="triton")
    r = lambda: raw_fn(x, w, s)
    e = lambda: torch.empty(sh.M, sh.N, dtype=torch.bfloat16, device=dev)
    ht, hr, he = host_us(f, n), host_us(r, n), host_us(e, n)
    L.BoundLaunch.__call__ = spy; seen.clear(); f(); L.BoundLaunch.__call__ = orig
    print(f"{sh.name:18} n={n:3d} host us median/min: triton {ht[0]:6.1f}/{ht[1]:6.1f}  raw+cumsum {hr[0]:6.1f}/{hr[1]:6.1f}  empty {he[0]:5.1f}/{he[1]:5.1f}  {seen}")
    if sh.name in ("mixtral-8x7b", "deepseek3-test"):
        pr = cProfile.Profile(); pr.enable()
        for _ in range(n): f()
        pr.disable(); torch.cuda.synchronize()
        st = io.StringIO(); pstats.Stats(pr, stream=st).sort_stats("tottime").print_stats(10); print(st.getvalue()[-2500:])
    del x, w
    torch.cuda.empty_cache()
