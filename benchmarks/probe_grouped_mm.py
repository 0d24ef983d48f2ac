"""Probe what torch._grouped_mm does on this GPU: dtypes, output dtype, empty groups, tail rows, cost of
zeroing the tail. Prints one line per finding."""

import torch

dev = "cuda"
torch.manual_seed(0)


def attempt(label, fn):
    try:
        out = fn()
        torch.cuda.synchronize()
        print(f"{label}: ok {tuple(out.shape)} {out.dtype} stride={out.stride()}")
        return out
    except Exception as exc:  # noqa: BLE001
        print(f"{label}: ERROR {type(exc).__name__}: {str(exc)[:160]}")
        return None


a = torch.randn(1000, 256, device=dev, dtype=torch.bfloat16)
b = torch.randn(4, 256, 136, device=dev, dtype=torch.bfloat16)
offs = torch.tensor([100, 100, 613, 900], device=dev, dtype=torch.int32)
out = attempt("2d3d bf16 unaligned offs", lambda: torch._grouped_mm(a, b, offs=offs))
if out is not None:
    ref = torch.cat([a[:100] @ b[0], a[100:613] @ b[2], a[613:900] @ b[3]])
    print("  err", ((out[:900].float() - ref.float()).norm() / ref.float().norm()).item(),
          "tail finite/zero:", torch.isfinite(out[900:]).all().item(), (out[900:] == 0).all().item())
attempt("2d3d bf16 out fp32", lambda: torch._grouped_mm(a, b, offs=offs, out_dtype=torch.float32))
attempt("2d3d fp16", lambda: torch._grouped_mm(a.half(), b.half(), offs=offs))
attempt("2d3d fp32", lambda: torch._grouped_mm(a.float(), b.float(), offs=offs))
attempt("2d3d N=100 (unaligned)", lambda: torch._grouped_mm(a, b[..., :100], offs=offs))
bt = b.transpose(1, 2).contiguous().transpose(1, 2)
attempt("2d3d b col-major", lambda: torch._grouped_mm(a, bt, offs=offs))
x = torch.randn(1000, 256, device=dev, dtype=torch.bfloat16)
dy = torch.randn(1000, 128, device=dev, dtype=torch.bfloat16)
w = attempt("2d2d wgrad x.T (col-major)", lambda: torch._grouped_mm(x.t(), dy, offs=offs))
if w is not None:
    print("  empty group exact zero:", (w[1] == 0).all().item())
    print("  err g2", ((w[2].float() - (x[100:613].t().float() @ dy[100:613].float())).norm()
                        / (x[100:613].t().float() @ dy[100:613].float()).norm()).item())
attempt("2d2d x.T contiguous", lambda: torch._grouped_mm(x.t().contiguous(), dy, offs=offs))
attempt("2d2d dy col-major", lambda: torch._grouped_mm(x.t(), dy.t().contiguous().t(), offs=offs))
# Cost of zeroing a tail by masked_fill over the full output vs the GEMM itself.
M, K, N, E = 20480, 4096, 1536, 128
a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
b = torch.randn(E, K, N, device=dev, dtype=torch.bfloat16)
offs = torch.cumsum(torch.full((E,), M // E, device=dev, dtype=torch.int32), 0).to(torch.int32)
rows = torch.arange(M, device=dev)
for label, fn in [
    ("gmm", lambda: torch._grouped_mm(a, b, offs=offs)),
    ("masked_fill", lambda: out.masked_fill_((rows >= offs[-1])[:, None], 0)),
]:
    out = torch._grouped_mm(a, b, offs=offs)
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        fn()
    e.record()
    torch.cuda.synchronize()
    print(f"time {label}: {s.elapsed_time(e) / 20:.4f} ms")
